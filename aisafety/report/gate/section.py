"""The report section of a candidate run's gate verdicts: ``aisafety check --report`` writes
the run's report with it, each verdict linked to its evidence (the model cards, the curves,
the certified accuracy or the sanity checks)."""

from __future__ import annotations

from aisafety.report.sections import ReportSection, ReportView


class GateVerdicts(ReportSection):
    name, title, order = "gate", "Release gate (aisafety check)", 5

    def render(self, report: ReportView) -> str | None:
        gate = getattr(report, "gate", None)  # set by ``aisafety check``, absent otherwise
        if not gate:
            return None
        return report.template("gate.html.j2", verdicts=gate["verdicts"], header=gate["header"],
                               summary=gate["summary"])  # fmt: skip
