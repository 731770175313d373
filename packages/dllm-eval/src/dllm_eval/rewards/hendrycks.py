"""The MATH answer normaliser of Hendrycks et al. (2021), with its failure behaviour made explicit.

Both reference protocols we reproduce compare MATH answers as strings after this normalisation:
d1 (``eval/parser_helper.py``: ``is_equiv``) and DARE (``verl/utils/reward_score/math_reward.py``:
``mathd_normalize_answer``). The normaliser raises on some inputs (``\\sqrt`` at the very end, an
empty ``\\frac`` tail, two ``"\\text{ "`` unit markers, and, in d1's copy only, ``a/b`` where ``a``
or ``b`` is not an integer); each caller has its own fallback for that, so here the failure is a
:class:`NormalisationError` and the caller decides.

Hendrycks et al., "Measuring Mathematical Problem Solving With the MATH Dataset", NeurIPS 2021.
"""

from __future__ import annotations

__all__ = ["NormalisationError", "hendrycks_normalize", "last_boxed_span"]


class NormalisationError(ValueError):
    """The normaliser met an input its reference implementation raises on."""


def _fix_fracs(s: str) -> str:
    """``\\frac12`` -> ``\\frac{1}{2}``, ``\\frac1{72}`` -> ``\\frac{1}{72}``."""
    head, *tails = s.split("\\frac")
    out = head
    for tail in tails:
        out += "\\frac"
        if not tail:
            raise NormalisationError("empty \\frac tail")
        if tail[0] == "{":
            out += tail
            continue
        if len(tail) < 2:
            return s
        a, b = tail[0], tail[1]
        out += f"{{{a}}}{{{b}}}{tail[2:]}" if b != "{" else f"{{{a}}}{b}{tail[2:]}"
    return out


def _fix_a_slash_b(s: str, *, strict_ints: bool) -> str:
    """``3/4`` -> ``\\frac{3}{4}`` when both sides are plain integers."""
    parts = s.split("/")
    if len(parts) != 2:
        return s
    try:
        a, b = int(parts[0]), int(parts[1])
    except ValueError:
        if strict_ints:
            raise NormalisationError(f"non-integer side in {s!r}") from None
        return s
    return f"\\frac{{{a}}}{{{b}}}" if s == f"{a}/{b}" else s


def _remove_right_units(s: str) -> str:
    if "\\text{ " not in s:
        return s
    parts = s.split("\\text{ ")
    if len(parts) != 2:
        raise NormalisationError("more than one '\\text{ ' unit marker")
    return parts[0]


def _fix_sqrt(s: str) -> str:
    """``\\sqrt3`` -> ``\\sqrt{3}``."""
    if "\\sqrt" not in s:
        return s
    head, *tails = s.split("\\sqrt")
    out = head
    for tail in tails:
        if not tail:
            raise NormalisationError("\\sqrt without an argument")
        out += f"\\sqrt{{{tail[0]}}}{tail[1:]}" if tail[0] != "{" else f"\\sqrt{tail}"
    return out


def hendrycks_normalize(answer: str, *, strict_ints: bool = False) -> str:
    """Canonical string form of a MATH answer (Hendrycks ``_strip_string``).

    Steps, in order: drop newlines and ``\\!``; ``\\\\`` -> ``\\``; ``tfrac``/``dfrac`` ->
    ``frac``; drop ``\\left``/``\\right``, degree marks and ``\\$``; cut a ``"\\text{ "`` unit
    suffix; drop ``\\%``; ``" ."``/``"{."`` -> ``" 0."``/``"{0."``; a leading ``.`` gains a 0;
    ``k = v`` with a left side of at most 2 characters -> ``v``; ``\\sqrt3`` -> ``\\sqrt{3}``;
    drop spaces; ``\\frac12`` -> ``\\frac{1}{2}``; ``0.5`` -> ``\\frac{1}{2}``; ``a/b`` ->
    ``\\frac{a}{b}`` for integers a, b.

    Args:
        answer: the answer string.
        strict_ints: raise on ``a/b`` with a non-integer side, as d1's copy does (DARE's copy
            leaves the string unchanged).

    Raises:
        NormalisationError: where the reference implementation raises (see module docstring).
    """
    s = answer
    for old, new in (("\n", ""), ("\\!", ""), ("\\\\", "\\"), ("tfrac", "frac"),
                     ("dfrac", "frac"), ("\\left", ""), ("\\right", ""), ("^{\\circ}", ""),
                     ("^\\circ", ""), ("\\$", "")):
        s = s.replace(old, new)
    s = _remove_right_units(s)
    s = s.replace("\\%", "").replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    sides = s.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:
        s = sides[1]
    s = _fix_fracs(_fix_sqrt(s).replace(" ", ""))
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _fix_a_slash_b(s, strict_ints=strict_ints)


def last_boxed_span(text: str) -> str | None:
    """The last ``\\boxed{...}`` (or, without one, ``\\fbox{...}``) including the command.

    Brace counting starts at the command, so the span ends at the first ``}`` that brings the
    count back to zero; None when no such ``}`` exists or neither command occurs.
    """
    idx = text.rfind("\\boxed")
    if idx < 0:
        idx = text.rfind("\\fbox")
        if idx < 0:
            return None
    depth = 0
    for i in range(idx, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[idx:i + 1]
    return None
