"""The built-in report sections in one list: registered by ``aisafety/builtin.py`` and read
by the report without the registry where only the built-ins are installed
(``aisafety/report_catalog.py``), so the two cannot drift apart."""

from __future__ import annotations

from aisafety.report.gate.section import GateVerdicts
from aisafety.report.sections import BUILTIN_SECTIONS, ReportSection


def builtin_sections() -> list[type[ReportSection]]:
    return [*BUILTIN_SECTIONS, GateVerdicts]
