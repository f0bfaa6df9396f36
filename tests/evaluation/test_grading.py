"""Answer extraction and Math-Verify grading: hand-written cases and the shared benchmarks' reference answers."""

from __future__ import annotations

import re

import pytest

from evaluation.grading import extract_boxed, grade, is_equivalent


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"so the answer is \boxed{42}.", "42"),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"nested \boxed{\left\{ 1, \{2\} \right\}} done", r"\left\{ 1, \{2\} \right\}"),
        (r"\boxed{a_{n+1} = {2}^{k}}", r"a_{n+1} = {2}^{k}"),
        (r"first \boxed{3} then \boxed{5}", "5"),  # several boxes: the last counts
        (r"$\boxed 7$", "7"),
        (r"\boxed 12.", "12"),
        (r"\fbox{9}", "9"),
        (r"\boxed {  x+1 }", "x+1"),
        (r"no box here, answer 5", None),
        ("", None),
        (None, None),
        (r"\boxed{}", None),
        (r"\boxed{3} and a cut-off \boxed{\frac{1}{", "3"),  # an unfinished box does not count
        (r"\boxedfoo{3}", None),
    ],
)
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


@pytest.mark.parametrize(
    "pred, gold, ok",
    [
        ("0.5", r"\frac{1}{2}", True),
        (r"\frac{1}{2}", "1/2", True),
        ("204", "204", True),
        ("205", "204", False),
        (r"(3, \frac{\pi}{2})", r"\left( 3, \frac{\pi}{2} \right)", True),
        ("1+x^2", "x^2+1", True),
        (None, "5", False),
        ("5", "", False),
    ],
)
def test_is_equivalent(pred, gold, ok):
    assert is_equivalent(pred, gold) is ok


def test_grade_uses_last_box():
    assert grade(r"maybe \boxed{3}... no, \boxed{\frac{6}{2}}", "3") == {"extracted": r"\frac{6}{2}", "correct": True}
    assert grade(r"\boxed{4} wait \boxed{5}", "4")["correct"] is False
    assert grade("no answer", "4") == {"extracted": None, "correct": False}


def _perturb(answer: str) -> str:
    """Change the first digit (or append +1): a different value in every shared reference answer."""
    m = re.search(r"\d", answer)
    if not m:
        return answer + "+1"
    d = int(m.group(0))
    new = 7 if d == 0 and m.start() == 0 else (d + 1) % 10
    return answer[: m.start()] + str(new) + answer[m.end() :]


def _shared(spec: str, every: int = 1):
    from foresight.data import load_problems

    return load_problems(spec)[::every]  # shipped inside the package: never skipped for missing data


@pytest.mark.parametrize("spec, every", [("aime24", 1), ("aime25", 1), ("math500", 4)])
def test_shared_reference_answers(spec, every):
    problems = _shared(spec, every)
    assert problems
    for p in problems:
        assert is_equivalent(p.answer, p.answer), p.answer
        assert grade(rf"... so the answer is $\boxed{{{p.answer}}}$.", p.answer)["correct"], p.answer
        wrong = _perturb(p.answer)
        assert not is_equivalent(wrong, p.answer), (p.answer, wrong)


@pytest.mark.slow
def test_all_math500_reference_answers():
    for p in _shared("math500"):
        assert is_equivalent(p.answer, p.answer) and not is_equivalent(_perturb(p.answer), p.answer), p.answer
