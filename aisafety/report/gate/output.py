"""The gate's verdicts for people and for CI: terminal lines, JUnit XML (one test case per
requirement, which every CI system shows) and Markdown for a pull-request comment."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Sequence

from aisafety.report.gate.verdicts import Verdict, gate_passed

SUITE = "aisafety check"


def summary(verdicts: Sequence[Verdict]) -> str:
    failed = sum(not v.passed for v in verdicts)
    if not failed:
        return f"PASS: {len(verdicts)} requirement(s) met"
    return f"FAIL: {failed} of {len(verdicts)} requirement(s) not met"


def text_lines(verdicts: Sequence[Verdict]) -> list[str]:
    """One line per verdict, then the summary."""
    lines = [f"{v.status.upper():4}  {v.name}\n      {v.detail}" for v in verdicts]
    return [*lines, summary(verdicts)]


def junit_xml(verdicts: Sequence[Verdict], header: str) -> str:
    """A JUnit XML document: a failed requirement is a test case with a <failure>."""
    failures = sum(not v.passed for v in verdicts)
    suites = ET.Element("testsuites", name=SUITE, tests=str(len(verdicts)),
                        failures=str(failures))  # fmt: skip
    suite = ET.SubElement(suites, "testsuite", name=SUITE, tests=str(len(verdicts)),
                          failures=str(failures), errors="0", skipped="0")  # fmt: skip
    ET.SubElement(ET.SubElement(suite, "properties"), "property", name="runs", value=header)
    for v in verdicts:
        case = ET.SubElement(suite, "testcase", classname=f"aisafety.check.{v.kind}", name=v.name)
        if v.passed:
            ET.SubElement(case, "system-out").text = v.detail
        else:
            ET.SubElement(case, "failure", message=v.detail, type=v.kind).text = v.detail
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def markdown(verdicts: Sequence[Verdict], header: str) -> str:
    """A Markdown summary: the overall verdict, then a table of every requirement."""
    icon = "✅" if gate_passed(verdicts) else "❌"
    rows = [
        f"| {'✅ pass' if v.passed else '❌ fail'} | {_cell(v.name)} | {_cell(v.detail)} |"
        for v in verdicts
    ]
    return "\n".join([
        f"### {icon} aisafety check: {summary(verdicts)}", "", header, "",
        "| verdict | requirement | evidence |", "|---|---|---|", *rows, "",
    ])  # fmt: skip


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
