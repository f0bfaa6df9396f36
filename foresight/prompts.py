"""Prompt construction: the model's chat template around a reasoning instruction.

The instruction text is a template with a ``{problem}`` placeholder (substituted literally, so the template
may contain other braces such as ``\\boxed{}``). The default asks for step-by-step reasoning and the final
answer in ``\\boxed{}``, the format the answer grader extracts.
"""

from __future__ import annotations

from pathlib import Path

from foresight.config import read_text
from foresight.errors import ForesightError

PLACEHOLDER = "{problem}"
DEFAULT_TEMPLATE = "{problem}\n\nPlease reason step by step, and put your final answer within \\boxed{}."


TEMPLATE_SUFFIXES = (".txt", ".md", ".jinja", ".j2", ".tmpl", ".template", ".prompt")


def _looks_like_path(text: str) -> bool:
    """Whether ``text`` (one line, no ``{problem}``) was meant as a file path: a path separator, a leading ``~``
    or a template-file suffix."""
    return ("/" in text or "\\" in text or text.startswith("~")
            or text.strip().lower().endswith(TEMPLATE_SUFFIXES))


def load_template(template: str | None) -> str:
    """Return the template text: ``None`` → default, an existing file path → its content, else the string."""
    if template is None:
        return DEFAULT_TEMPLATE
    if PLACEHOLDER not in template and "\n" not in template and template.strip():
        path = Path(template).expanduser()
        try:
            is_file, exists = path.is_file(), path.exists()
        except OSError:  # e.g. a one-line text too long to be a file name
            is_file = exists = False
        if is_file:
            text = read_text(path, "prompt template file")  # an encoding error names the file
            if PLACEHOLDER not in text:
                raise ForesightError(f"prompt template file {template} must contain the placeholder {PLACEHOLDER}")
            return text
        elif exists or _looks_like_path(template):  # a text template without {problem} is refused anyway: name the file
            what = "is not a file" if exists else "not found"
            raise ForesightError(f"prompt template file {template} {what} (a template is a file path or text "
                                 f"with the placeholder {PLACEHOLDER})")
    if PLACEHOLDER not in template:
        raise ForesightError(f"prompt template must contain the placeholder {PLACEHOLDER}: {template[:80]!r}")
    return template


def build_prompt(tokenizer, problem_text: str, template: str | None = None) -> str:
    """The full prompt string for one problem: chat template (when the tokenizer has one) + instruction.

    Parameters
    ----------
    tokenizer
        The model's tokenizer; its chat template wraps the message as a user turn with the assistant turn
        opened (``add_generation_prompt=True``). Tokenizers without a chat template get the plain text.
    problem_text
        The problem statement.
    template
        Instruction template (text or file path) with a ``{problem}`` placeholder; default :data:`DEFAULT_TEMPLATE`.
    """
    content = load_template(template).replace(PLACEHOLDER, problem_text)
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
        )
    return content
