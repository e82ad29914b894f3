"""How to cite the methods this library implements: one place for the model cards and the docs."""

from __future__ import annotations

TROLL_TITLE = "TROLL: Trust Regions improve Reinforcement Learning for Large Language Models"
TROLL_ARXIV = "2510.03817"
TROLL_BIBTEX = """@article{becker2025troll,
    title   = {{TROLL: Trust Regions improve Reinforcement Learning for Large Language Models}},
    author  = {Philipp Becker and Niklas Freymuth and Serge Thilges and Fabian Otto and Gerhard Neumann},
    year    = 2025,
    eprint  = {arXiv:2510.03817},
}"""
GRPO_BIBTEX = """@article{shao2024deepseekmath,
    title   = {{DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models}},
    author  = {Zhihong Shao and Peiyi Wang and Qihao Zhu and Runxin Xu and Junxiao Song and Mingchuan Zhang and
               Y. K. Li and Y. Wu and Daya Guo},
    year    = 2024,
    eprint  = {arXiv:2402.03300},
}"""
