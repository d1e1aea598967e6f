"""Factorial effects in words: the lines, and the section of the report document that holds them."""

from __future__ import annotations

import math

from gptlab.compare.render.sections import Preformatted
from gptlab.compare.render.words import NOT_TIMED, p_value


def _effect_line(e: dict, speed: bool) -> str:
    if speed:  # log tokens/s: a ratio of speeds
        return f"{e['term']:<22} ×{math.exp(e['effect']):.3f} [×{math.exp(e['lo']):.3f}, ×{math.exp(e['hi']):.3f}]  p={p_value(e['p'])}"
    return f"{e['term']:<22} {e['effect']:+.4f} [{e['lo']:+.4f}, {e['hi']:+.4f}]  p={p_value(e['p'])}"


def additivity_line(fit: dict, speed: bool, factors: list[str]) -> str:
    """One line: is the all-on arm's effect the sum (loss) / product (speed) of its parts?"""
    add = fit["additivity"]
    everything = "+".join(factors)
    if speed:
        c, p, d = (math.exp(add[k][0]) for k in ("combined", "sum_of_parts", "difference"))
        lo, hi = math.exp(add["difference"][1]), math.exp(add["difference"][2])
        head = (
            f"speed: {everything} ×{c:.3f} vs the product of its parts ×{p:.3f}; ratio ×{d:.3f} [×{lo:.3f}, ×{hi:.3f}]"
        )
        what = "multiplicative (the parts compose)" if add["additive"] else "NOT multiplicative: the parts interact"
    else:
        c, p, d = (add[k][0] for k in ("combined", "sum_of_parts", "difference"))
        lo, hi = add["difference"][1], add["difference"][2]
        head = (
            f"loss: {everything} {c:+.4f} vs the sum of its parts {p:+.4f}; difference {d:+.4f} [{lo:+.4f}, {hi:+.4f}]"
        )
        what = "additive (the parts compose)" if add["additive"] else "NOT additive: the parts interact"
    return f"{head}: {what} (p={p_value(add['difference'][3])})"


def lines(doc: dict) -> list[str]:
    """The terminal / Markdown text: effects on loss, on speed, the additivity lines and the load flag."""
    pct = f"{100 * (1 - doc['alpha']):.0f}%"
    out = [f"factorial effects of {' x '.join(doc['factors'])} ({doc['runs']} runs; effect [{pct} CI], OLS t-test):"]
    out.append(f"final val loss (residual df {doc['loss']['df_resid']}):")
    out += ["  " + _effect_line(e, False) for e in doc["loss"]["effects"]]
    out.append("  " + additivity_line(doc["loss"], False, doc["factors"]))
    if "speed" in doc:
        flag = (
            f"  [under load: {', '.join(doc['speed_under_load'])} timed with > {100 * doc['load_limit']:.0f}% of cores "
            "busy elsewhere: speed effects not to be trusted]"
            if doc["speed_under_load"]
            else ""
        )
        out.append(
            f"speed (tokens/s timed alone, {doc['speed_rounds']} rounds of the timing session as blocks, residual df "
            f"{doc['speed']['df_resid']}; effects as ratios){flag}:"
        )
        out += ["  " + _effect_line(e, True) for e in doc["speed"]["effects"]]
        out.append("  " + additivity_line(doc["speed"], True, doc["factors"]))
    elif doc.get("speed_not_timed"):
        out.append(
            f"speed: {NOT_TIMED}: no timing session times the arms, and a training run's own tokens/s is not a "
            f"measurement of its arm (time them: {doc['speed_not_timed']})"
        )
    elif doc.get("speed_missing"):
        missing = doc["speed_missing"]
        out.append(
            f"speed: not estimated: {'arm' if len(missing) == 1 else 'arms'} {', '.join(missing)} not timed by the "
            f"timing session, and the effects need every one of the {2 ** len(doc['factors'])} arms"
        )
    else:
        out.append("speed: fewer than 2 complete rounds of the timing session: no speed effects")
    return out


def section(doc: dict) -> Preformatted:
    """The factorial effects as a section of the report document, laid out as the terminal lines."""
    return Preformatted("Factorial effects", "\n".join(lines(doc)))
