"""A strict reader of Prometheus's text exposition format (0.0.4), for the tests of kcompact's metrics file."""

from __future__ import annotations

import re

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
VALUE = r"(?:[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?|NaN|[+-]Inf)"
SAMPLE = re.compile(rf"^({NAME})(\{{{LABEL}(?:,{LABEL})*\}})? ({VALUE})$")
HELP = re.compile(rf"^# HELP ({NAME}) (?:[^\\\n]|\\[\\n])*$")
TYPE = re.compile(rf"^# TYPE ({NAME}) (counter|gauge|histogram|summary|untyped)$")


def parse_strict(text: str) -> dict[tuple[str, str], float]:
    """Check `text` against the text exposition format (0.0.4) line by line; return {(name, labels): value}.

    HELP then TYPE once per family, before its samples; a family's samples contiguous; no sample twice.
    """
    assert text.endswith("\n") and not text.endswith("\n\n")
    samples: dict[tuple[str, str], float] = {}
    typed: set[str] = set()
    current = None
    helped = None
    for line in text[:-1].split("\n"):
        if m := HELP.match(line):
            assert m.group(1) not in typed, f"HELP after the family's samples: {line}"
            helped = m.group(1)
        elif m := TYPE.match(line):
            assert m.group(1) not in typed, f"second TYPE for {m.group(1)}"
            assert helped == m.group(1), f"TYPE without HELP just before: {line}"
            typed.add(m.group(1))
            current = m.group(1)
        elif m := SAMPLE.match(line):
            name, labels, value = m.groups()
            assert name == current, f"sample {name} outside its family ({current})"
            assert (name, labels or "") not in samples, f"duplicate sample: {line}"
            samples[(name, labels or "")] = float(value)
        else:
            raise AssertionError(f"not the exposition format: {line!r}")
    return samples
