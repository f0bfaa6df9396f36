"""Final-answer extraction (the last ``\\boxed{...}``) and grading with ``math-verify``.

Answers are compared symbolically by Hugging Face's Math-Verify (https://github.com/huggingface/Math-Verify):
``verify(parse(gold), parse(prediction))``, so ``\\frac{1}{2}``, ``0.5`` and ``1/2`` agree.
"""

from __future__ import annotations

import re

from math_verify import parse, verify

_BOX = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")


def _braced(text: str, start: int) -> tuple[str, int] | None:
    """Content of the brace group opening at ``text[start] == '{'`` (nested braces balanced), and its end."""
    depth = 0
    i = start
    while i < len(text):
        c = text[i]
        if c == "\\":  # skip escaped characters such as \{ and \}
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i], i + 1
        i += 1
    return None  # unbalanced: the box was cut off


def extract_boxed(text: str | None) -> str | None:
    """The content of the last ``\\boxed{...}`` / ``\\fbox{...}`` (or ``\\boxed 5``) in ``text``; None if none.

    Nested braces are balanced (``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}``); a box cut off before its
    closing brace does not count; when several boxes appear the last complete one wins.
    """
    if not text:
        return None
    for match in reversed(list(_BOX.finditer(text))):
        i = match.end()
        while i < len(text) and text[i] in " \t":
            i += 1
        if i < len(text) and text[i] == "{":
            got = _braced(text, i)
            if got is None:
                continue
            content = got[0].strip()
            return content or None
        if match.group(0) == "\\boxed" and i > match.end():  # "\boxed 5": up to whitespace or math delimiter
            token = re.match(r"[^\s$]+", text[i:])
            if token:
                return token.group(0).rstrip(".,;")
    return None


def _parse(expr: str):
    return parse(f"${expr}$", parsing_timeout=5)


def is_equivalent(prediction: str | None, gold: str) -> bool:
    """True when ``prediction`` is mathematically equal to ``gold`` under Math-Verify (None is wrong)."""
    if prediction is None or not str(gold).strip():
        return False
    gold_parsed = _parse(str(gold))
    pred_parsed = _parse(prediction)
    if not gold_parsed or not pred_parsed:
        return prediction.strip() == str(gold).strip()
    try:
        return bool(verify(gold_parsed, pred_parsed, timeout_seconds=5))
    except Exception:  # math-verify raises on exotic expressions; fall back to string equality
        return prediction.strip() == str(gold).strip()


def grade(text: str, gold: str) -> dict:
    """Extract the final boxed answer of a completion and grade it: ``{"extracted", "correct"}``."""
    pred = extract_boxed(text)
    return {"extracted": pred, "correct": is_equivalent(pred, gold)}


__all__ = ["extract_boxed", "grade", "is_equivalent"]
