"""The program every scoring run executes inside the sandbox (its source is sent as ``python -I -S -c``).

It reads its job from stdin as JSON (the model's program, the kind of tests, their inputs, never their expected
outputs), sets the rlimits, takes private references to everything it writes with, moves the result channel off
fd 1, reports ``{"ready": 1}`` and only then runs untrusted code. It reports *values*, one JSON line per test,
and the parent compares them with the expected ones. Whatever the model's code patches afterwards (``json``,
``print``, builtins), it can at most forge values it does not know, or stop the reports (its tests then fail).

- ``call``: the program runs once as a module; each test calls ``entry_point(*input)`` under a per-test timer,
  and the return value is written by a strict serialiser that takes only exact builtin types (``type(x) is int``
  and so on), so an object with an always-true ``__eq__`` is no value at all.
- ``stdio``: each test forks a child with the test's input on stdin and a pipe on stdout, which runs the program
  as ``__main__``; the harness reads at most ``output`` bytes of it within the per-test timeout, then kills the
  child's process group and reports the output.
"""

import json
import os
import resource
import select
import signal
import sys


def main(os=os, write=os.write, fork=os.fork, killpg=os.killpg, waitpid=os.waitpid, _exit=os._exit):
    job = json.loads(sys.stdin.buffer.read())
    for name, value in job["rlimits"].items():
        resource.setrlimit(getattr(resource, name), (value, value))
    from _json import encode_basestring_ascii as quote

    out = os.dup(1)  # the result channel; fd 0 and 1 now lead nowhere
    null = os.open("/dev/null", os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)

    def report(line, out=out, write=write):
        data = (line + "\n").encode()
        while data:
            data = data[write(out, data) :]

    report('{"ready": 1}')
    try:
        code = compile(job["program"], "<program>", "exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError) as err:
        report('{"syntax_error": ' + quote(type(err).__name__ + ": " + str(err)) + "}")
        _exit(0)
    if job["kind"] == "call":
        run_calls(job, code, report, quote)
    else:
        run_stdio(job, code, report, quote, out, fork, killpg, waitpid, _exit, os)
    report('{"done": 1}')
    _exit(0)


class _Timeout(BaseException):
    pass


def _alarm(signum, frame):
    raise _Timeout()


def run_calls(job, code, report, quote, setitimer=signal.setitimer, signal_=signal.signal, str_=str, type_=type):
    """Run the module, then each test; a test that raises, times out or returns no plain value fails."""
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    timeout = job["timeout"]
    signal_(signal.SIGALRM, _alarm)
    try:
        setitimer(signal.ITIMER_REAL, timeout)
        exec(code, namespace)
    except BaseException:  # noqa: BLE001 -- sys.exit at the top level still lets the tests run
        pass
    finally:
        setitimer(signal.ITIMER_REAL, 0)
    function = namespace.get(job["entry_point"])
    if not callable(function):
        report('{"missing": ' + quote(str_(job["entry_point"])) + "}")
        return
    for i, args in enumerate(job["inputs"]):
        try:
            signal_(signal.SIGALRM, _alarm)
            setitimer(signal.ITIMER_REAL, timeout)
            value = function(*args)
            setitimer(signal.ITIMER_REAL, 0)
            line = f'{{"case": {i}, "value": {dump(value, quote, job["output"])}}}'
        except _Timeout:
            line = f'{{"case": {i}, "error": "timeout"}}'
        except BaseException as err:  # noqa: BLE001 -- the model's exception, or SystemExit
            setitimer(signal.ITIMER_REAL, 0)
            line = f'{{"case": {i}, "error": {quote(type_(err).__name__)}}}'
        report(line)


def dump(value, quote, limit, depth=0, type_=type, repr_int=int.__repr__, repr_float=float.__repr__, len_=len):
    """JSON text of ``value`` if it is built only of exact builtin types (no subclass, no NaN); raise otherwise."""
    t = type_(value)
    if depth > 100:
        raise ValueError("nested too deep")
    if value is None:
        return "null"
    if t is bool:
        return "true" if value else "false"
    if t is int:
        return repr_int(value)
    if t is float:
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError("not finite")
        return repr_float(value)
    if t is str:
        return quote(value)
    if t is list or t is tuple:
        parts, size = [], 0
        for item in value:
            parts.append(dump(item, quote, limit, depth + 1))
            size += len_(parts[-1])
            if size > limit:
                raise ValueError("too large")
        return "[" + ",".join(parts) + "]"
    if t is dict:
        parts, size = [], 0
        for key, item in value.items():
            if type_(key) is not str:
                raise ValueError("dict key is not a str")
            parts.append(quote(key) + ":" + dump(item, quote, limit, depth + 1))
            size += len_(parts[-1])
            if size > limit:
                raise ValueError("too large")
        return "{" + ",".join(parts) + "}"
    raise ValueError("not a plain value")


def run_stdio(job, code, report, quote, out, fork, killpg, waitpid, _exit, os):
    """Run the program once per test in a forked child with that test's stdin; report what it printed."""
    import time

    timeout, cap = job["timeout"], job["output"]
    for i, text in enumerate(job["inputs"]):
        path = f"/tmp/.stdin-{i}"
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        read_end, write_end = os.pipe()
        pid = fork()
        if pid == 0:  # the child: the result channel closed before the program runs
            try:
                os.close(out)
                os.close(read_end)
                os.setpgid(0, 0)
                os.dup2(os.open(path, os.O_RDONLY), 0)
                os.dup2(write_end, 1)
                run_main(code)
            finally:
                _exit(1)
        os.close(write_end)
        data, timed_out, truncated = bytearray(), False, False
        deadline = time.monotonic() + timeout
        exited = None
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            ready, _, _ = select.select([read_end], [], [], min(left, 0.05))
            if ready:
                chunk = os.read(read_end, 65536)
                if not chunk:
                    break
                data += chunk
                if len(data) > cap:
                    truncated = True
                    break
            elif exited is None and waitpid(pid, os.WNOHANG)[0]:  # the child left a descendant holding the pipe
                exited = True
                break
        os.close(read_end)
        try:
            killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        if exited is None:
            waitpid(pid, 0)
        try:
            text = quote(bytes(data[:cap]).decode("utf-8"))
        except UnicodeDecodeError:  # no text: the test fails
            report(f'{{"case": {i}, "error": "not_utf8"}}')
            continue
        flags = f'"timeout": {"true" if timed_out else "false"}, "truncated": {"true" if truncated else "false"}'
        report(f'{{"case": {i}, "stdout": {text}, {flags}}}')


def run_main(code):
    """In the child: the program as ``__main__`` with fresh text streams on fd 0 and 1, flushed at its end."""
    import builtins

    sys.stdin = sys.__stdin__ = open(0, encoding="utf-8", closefd=False)
    sys.stdout = sys.__stdout__ = open(1, "w", encoding="utf-8", closefd=False)
    status = 0
    try:
        exec(code, {"__name__": "__main__", "__builtins__": builtins})
    except SystemExit as err:
        status = err.code if isinstance(err.code, int) else 1
    except BaseException:  # noqa: BLE001 -- the program's error: its output so far still counts
        status = 1
    try:
        sys.stdout.flush()
    except BaseException:  # noqa: BLE001
        status = 1
    os._exit(status & 0xFF)


if __name__ == "__main__":
    main()
