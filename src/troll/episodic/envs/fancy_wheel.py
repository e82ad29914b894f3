"""The fancy-gym wheel whose model files box pushing and hopper jump load (fancy_gym itself is never imported: it
pins mujoco 2.3.3 and gymnasium < 1), and the pip commands an asset error names.

pip leaves an installed fancy-gym 0.3.0 as it is, damaged files included, unless told ``--force-reinstall``: a missing
or wrong version needs :data:`INSTALL_STEP`, a missing or changed file of the installed 0.3.0 :data:`REINSTALL_STEP`.
"""

WHEEL, WHEEL_VERSION = "fancy-gym", "0.3.0"
INSTALL_STEP = f"pip install --no-deps {WHEEL}=={WHEEL_VERSION} (a step of `make`'s install of .venv)"
REINSTALL_STEP = f"pip install --force-reinstall --no-deps {WHEEL}=={WHEEL_VERSION}"
