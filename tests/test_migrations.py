"""Schema versions (Alembic, aisafety/store/migration.py): databases of older layouts are
brought forward without losing a row, new ones are created at the head, a newer one is
refused, read-only opens change nothing; on SQLite and on a real PostgreSQL server."""

from __future__ import annotations

import hashlib
import shutil
import threading
from pathlib import Path

import pytest
from legacy_layouts import LAYOUTS, build, dump
from sqlalchemy import create_engine, text

from aisafety.cli import main
from aisafety.errors import AISafetyWarning, StoreError
from aisafety.interfaces import AttackSpec, DatasetSpec, EvaluationPlan, MetricSpec
from aisafety.runner import Runner
from aisafety.store import schema
from aisafety.store.migration import MIGRATIONS, migrate, stamped
from aisafety.store.migrations import HEAD
from aisafety.store.results import ResultStore
from aisafety.store.semantics import CURRENT
from aisafety.warning_log import KeptWarning

PLAN = EvaluationPlan(
    dataset=DatasetSpec(limit=20),
    attacks=(AttackSpec(name="fgsm", eps=(0.1,)),),
    metrics=tuple(MetricSpec(name=n) for n in ("ca", "aaw")),
    device="cpu",
)


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path) -> str:
    """An empty database: a SQLite file, then one on the tests' PostgreSQL server."""
    if request.param == "postgresql":
        return request.getfixturevalue("postgres_url")
    return f"sqlite:///{tmp_path / 'r.db'}"


def _scalar(url: str, sql: str):
    engine = create_engine(url)
    with engine.connect() as connection:
        value = connection.execute(text(sql)).scalar()
    engine.dispose()
    return value


def _revisions(url: str) -> tuple[str, ...]:
    engine = create_engine(url)
    with engine.connect() as connection:
        revisions = stamped(connection)
    engine.dispose()
    return revisions


def _schema_differences(url: str) -> list:
    """What Alembic's autogenerate finds between the database and schema.py (none: equal).
    SQLite's declared INTEGER of an old ``runs.seed`` is left: SQLite integers have 64 bits
    whatever the declared type, so the baseline does not copy the table to rename it."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    engine = create_engine(url)
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        differences = compare_metadata(context, schema.Base.metadata)
    engine.dispose()
    return [
        d
        for d in differences
        if not (url.startswith("sqlite") and d[0][0] == "modify_type" and d[0][3] == "seed")
    ]


def _views(url: str) -> dict[str, str]:
    engine = create_engine(url)
    with engine.connect() as connection:
        if url.startswith("sqlite"):
            sql = "SELECT name, sql FROM sqlite_master WHERE type = 'view'"
        else:
            sql = "SELECT viewname, definition FROM pg_views WHERE schemaname = 'public'"
        views = {name: " ".join(body.split()) for name, body in connection.execute(text(sql))}
    engine.dispose()
    return views


def test_head_is_the_newest_revision():
    from alembic.script import ScriptDirectory

    assert ScriptDirectory(str(MIGRATIONS)).get_heads() == [HEAD]


@pytest.mark.parametrize("release", LAYOUTS)
def test_an_old_layout_is_upgraded_without_losing_a_row(url, release):
    build(url, release)
    before = dump(url, release)
    store = ResultStore(url)
    assert _revisions(url) == (HEAD,)
    assert dump(url, release) == before  # every row, every old column, unchanged
    assert _schema_differences(url) == []
    # the new columns are there, empty for the old rows
    assert _scalar(url, "SELECT COUNT(*) FROM sample_outcomes WHERE broken_by IS NULL") == 5
    assert _scalar(url, "SELECT COUNT(*) FROM ensemble_members") == 0
    # the old run reads through today's views; a new run is written next to it
    assert store.query("SELECT metric, value FROM results WHERE run_id = 1 ORDER BY metric")[1] == [
        ("aaw", None),
        ("ca", 0.8),
        ("ra", 0.6),
    ]
    record = Runner(PLAN, store, quiet=True).run()
    assert record.run_id == 2 and len(record.values) == 2
    assert Runner(PLAN, store, resume=True, quiet=True).run().resumed_units == 2
    big = store.start_run(PLAN.model_copy(update={"seed": 2**63 - 1}), "test", "cpu")
    assert _scalar(url, f"SELECT seed FROM runs WHERE id = {big}") == 2**63 - 1
    store.finish_run(big)
    # units written before their row counts existed are not taken as finished (recomputed)
    assert "k-fgsm" not in store.finished_units()


def _upgrade(url: str, revision: str) -> None:
    """The shipped revisions run on ``url`` up to ``revision`` (as that release's store did)."""
    from alembic import command
    from alembic.config import Config

    engine = create_engine(url)
    with engine.begin() as connection:
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        config.attributes["connection"] = connection
        command.upgrade(config, revision)
    engine.dispose()


def test_a_database_at_the_previous_head_is_upgraded_without_losing_a_row(url, tmp_path):
    """The newest revision on a database the release before it wrote (the old layout's rows
    brought to the previous head, a unit's cost in 0003's column): every row kept, the old
    run's semantics version left NULL (read as the version before every change), a new
    run's stored as this code's, and a new run's warning stored."""
    from alembic.script import ScriptDirectory

    previous = ScriptDirectory(str(MIGRATIONS)).get_revision(HEAD).down_revision
    build(url, "7896022")
    _upgrade(url, previous)
    engine = create_engine(url)
    with engine.begin() as connection:
        connection.execute(text("UPDATE units SET seconds = 1.5 WHERE key = 'k-clean'"))
    engine.dispose()
    assert _revisions(url) == (previous,)
    before = dump(url, "7896022")
    store = ResultStore(url)
    assert _revisions(url) == (HEAD,)
    assert dump(url, "7896022") == before
    assert _scalar(url, "SELECT seconds FROM units WHERE key = 'k-clean'") == 1.5
    assert _schema_differences(url) == []
    assert _scalar(url, "SELECT COUNT(*) FROM run_warnings") == 0
    run_id = store.start_run(PLAN, "test", "cpu")
    store.finish_run(run_id, "finished", [KeptWarning(None, AISafetyWarning, "at chance")])
    assert store.run_warnings(run_id) == [(None, "AISafetyWarning", "at chance")]
    assert _scalar(url, "SELECT COUNT(*) FROM runs WHERE semantics_version IS NULL") == 1
    assert _scalar(url, f"SELECT semantics_version FROM runs WHERE id = {run_id}") == CURRENT
    # 0006: no old run reused a unit; a resumed run's reuse of the old run's unit is stored
    assert _scalar(url, "SELECT COUNT(*) FROM reused_units") == 0
    assert store.record_reused(run_id, ["k-clean"]) == {"k-clean": 1}
    assert store.reused_units(run_id) == {"k-clean": 1}


def test_a_new_database_is_created_at_the_head(url):
    ResultStore(url)
    assert _revisions(url) == (HEAD,)
    assert _schema_differences(url) == []
    ResultStore(url)  # opening it again changes nothing
    assert _revisions(url) == (HEAD,)


def test_the_revisions_alone_build_the_schema_of_the_code(url, tmp_path):
    """Upgrading an empty database through every revision gives exactly the tables of
    schema.py and the views of a new database: a change to schema.py without its revision
    fails here."""
    from alembic import command
    from alembic.config import Config

    engine = create_engine(url)
    with engine.begin() as connection:
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        config.attributes["connection"] = connection
        command.upgrade(config, "heads")
    engine.dispose()
    assert _revisions(url) == (HEAD,)
    assert _schema_differences(url) == []
    fresh = f"sqlite:///{tmp_path / 'fresh.db'}" if url.startswith("sqlite") else None
    if fresh is not None:  # views as the store creates them (PostgreSQL rewrites their SQL)
        ResultStore(fresh)
        assert _views(url).keys() == _views(fresh).keys() == {"results", "accuracy_curves"}
        for name, body in _views(fresh).items():
            assert body.split(" AS ", 1)[1] == _views(url)[name].split(" AS ", 1)[1]
    else:
        assert set(_views(url)) == {"results", "accuracy_curves"}


NEXT_REVISION = '''"""A later revision for the tests: a column filled from its rows, a table."""
import sqlalchemy as sa
from alembic import op

revision = "0002_test"
down_revision = "{head}"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("seed_text", sa.String(32), nullable=True))
    op.execute("UPDATE runs SET seed_text = CAST(seed AS VARCHAR(32))")
    op.create_table("notes", sa.Column("id", sa.Integer, primary_key=True),
                    sa.Column("text", sa.Text, nullable=False))


def downgrade() -> None:
    op.drop_table("notes")
    op.drop_column("runs", "seed_text")
'''


def _later_scripts(tmp_path: Path) -> Path:
    """The shipped migrations plus a revision 0002 (what the next schema change looks like)."""
    scripts = tmp_path / "migrations"
    shutil.copytree(MIGRATIONS, scripts, ignore=shutil.ignore_patterns("__pycache__"))
    (scripts / "versions" / "0002_test.py").write_text(NEXT_REVISION.format(head=HEAD))
    return scripts


def test_a_later_revision_upgrades_a_stamped_database_and_older_code_refuses_it(
    url, tmp_path, capsys
):
    store = ResultStore(url)
    Runner(PLAN, store, quiet=True).run()
    tables = ("runs", "units", "metric_values", "attack_runs", "sample_outcomes")
    counts = {t: _scalar(url, f"SELECT COUNT(*) FROM {t}") for t in tables}
    migrate(store.engine, schema.Base.metadata, schema.VIEWS, _later_scripts(tmp_path), "0002_test")
    assert _revisions(url) == ("0002_test",)
    assert {t: _scalar(url, f"SELECT COUNT(*) FROM {t}") for t in tables} == counts
    assert _scalar(url, "SELECT seed_text FROM runs") == "0"
    # today's code does not know 0002: refused, naming the revision and the fix
    with pytest.raises(StoreError, match=r"revision '0002_test'.*Upgrade aisafety"):
        ResultStore(url)
    assert main(["evaluate", "--db", url, "--limit", "20", "--quiet"]) != 0
    err = capsys.readouterr().err
    assert "0002_test" in err and "pip install -U aisafety" in err and "Traceback" not in err
    assert _revisions(url) == ("0002_test",)
    assert _scalar(url, "SELECT COUNT(*) FROM runs") == counts["runs"]


def test_a_failing_revision_leaves_the_database_as_it_was(url, tmp_path):
    """The upgrade is one transaction: a revision that fails half-way changes nothing."""
    store = ResultStore(url)
    scripts = _later_scripts(tmp_path)
    broken = (
        (scripts / "versions" / "0002_test.py")
        .read_text()
        .replace(
            '    op.create_table("notes"',
            '    raise RuntimeError("half-way")\n    op.create_table("notes"',
        )
    )
    (scripts / "versions" / "0002_test.py").write_text(broken)
    with pytest.raises(RuntimeError, match="half-way"):
        migrate(store.engine, schema.Base.metadata, schema.VIEWS, scripts, "0002_test")
    assert _revisions(url) == (HEAD,)
    assert _schema_differences(url) == []  # runs.seed_text was not added
    Runner(PLAN, store, quiet=True).run()


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_read_only_query_does_not_migrate(url, capsys):
    build(url, "2a40541")
    path = Path(url.removeprefix("sqlite:///")) if url.startswith("sqlite") else None
    digest = _digest(path) if path else None
    assert main(["query", "--db", url, "SELECT COUNT(*) FROM sample_outcomes"]) == 0
    assert "5" in capsys.readouterr().out
    assert _revisions(url) == ()
    assert _scalar(url, "SELECT COUNT(*) FROM runs") == 1
    if path is not None:
        assert _digest(path) == digest


def test_many_processes_upgrade_one_old_database_at_once(url):
    """Ray workers open the database together: one upgrades it, the others wait and find it
    done; no error, no row lost, one version row."""
    build(url, "2a40541")
    before = dump(url, "2a40541")
    barrier = threading.Barrier(6)
    errors: list[BaseException] = []

    def open_store() -> None:
        try:
            barrier.wait()
            ResultStore(url).engine.dispose()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=open_store) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    assert _revisions(url) == (HEAD,)
    assert _scalar(url, "SELECT COUNT(*) FROM alembic_version") == 1
    assert dump(url, "2a40541") == before
