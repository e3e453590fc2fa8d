"""``gnn-ptp sweep`` on the SYNTHETIC dataset (made-up graphs and times, see synthetic_data.py): the
default SQLite study, pruning, the best trial as a training config that ``gnn-ptp train`` reads back,
and two worker processes sharing one study on a real PostgreSQL server started here."""

from __future__ import annotations

import glob
import os
import pwd
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from gnn_ptp import cli, dataset
from gnn_ptp.errors import UserError
from gnn_ptp.sweep import best_config, storage_url, sweep, to_toml, write_best
from gnn_ptp.train import TrainConfig, load_train_config

from synthetic_data import load_synthetic_graphs, write_synthetic_dataset

optuna = pytest.importorskip("optuna")
TESTS = Path(__file__).resolve().parent
BASE = TrainConfig(threads=1)
FINISHED = {optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED}


@pytest.fixture
def synthetic_dir(tmp_path, monkeypatch):
    """A SYNTHETIC dataset folder; its graphs are made up from the record keys instead of traced."""
    monkeypatch.setattr(dataset, "load_graphs", load_synthetic_graphs)
    return write_synthetic_dataset(tmp_path / "synthetic-cpu")


def test_sqlite_default_study_and_best_config_round_trip(synthetic_dir, tmp_path):
    lines: list[str] = []
    out = tmp_path / "training" / "best.toml"
    study = sweep(synthetic_dir, 3, out_config=out, epochs=3, seed=0, log=lines.append, base=BASE)

    db = synthetic_dir / ".cache" / "sweep.db"
    assert db.is_file()
    assert storage_url(None, synthetic_dir) == f"sqlite:///{db.resolve()}"
    trials = study.get_trials()
    assert len(trials) == 3 and {t.state for t in trials} <= FINISHED
    assert any(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    trial_lines = [line for line in lines if line.startswith("trial ")]
    assert [int(line.split()[1]) for line in trial_lines] == [0, 1, 2]  # one line per finished trial
    for t in trials:  # every epoch run was reported, at most the 3 asked for
        assert 1 <= len(t.intermediate_values) <= 3 and max(t.intermediate_values) == t.user_attrs["epochs_run"]

    cfg = load_train_config(out)  # what `gnn-ptp train --config` reads
    assert cfg == best_config(study)
    best = study.best_trial
    assert cfg.lr == best.params["lr"] and cfg.batch_size == best.params["batch_size"]
    assert cfg.model.layer == best.params["layer"] and cfg.model.hidden == best.params["hidden"]
    assert cfg.model.dropout == best.params["dropout"] and cfg.epochs == 3 and cfg.threads == BASE.threads
    assert out.read_text().startswith(f"# Best trial {best.number} of Optuna study 'gnn-ptp'")

    again = sweep(synthetic_dir, 1, epochs=2, seed=1, log=lines.append, base=BASE)  # joins the same study
    assert len(again.trials) == 4
    assert len(optuna.load_study(study_name="gnn-ptp", storage=f"sqlite:///{db}").trials) == 4


def test_pruning_stops_training_at_the_reported_epoch(synthetic_dir, tmp_path):
    lines: list[str] = []
    prune_all = optuna.pruners.ThresholdPruner(upper=0.0)  # any validation error prunes at once
    study = sweep(synthetic_dir, 2, storage=tmp_path / "pruned.db", epochs=5, log=lines.append, base=BASE,
                  pruner=prune_all)
    for t in study.trials:
        assert t.state == optuna.trial.TrialState.PRUNED
        assert list(t.intermediate_values) == [1] and t.user_attrs["epochs_run"] == 1  # 4 epochs not run
    assert sum("pruned at epoch 1" in line for line in lines) == 2
    with pytest.raises(UserError, match="no completed trial"):
        write_best(study, tmp_path / "best.toml")


def test_cli_sweep_writes_a_config_that_train_accepts(synthetic_dir, tmp_path, capsys):
    best = tmp_path / "best.toml"
    code = cli.main(["sweep", "--data", str(synthetic_dir), "--trials", "2", "--epochs", "2", "--seed", "3",
                     "--storage", str(tmp_path / "my.db"), "--study", "cli", "--write-best", str(best),
                     "--threads", "1"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert len(re.findall(r"^trial +\d+ ", out, flags=re.M)) == 2
    assert (tmp_path / "my.db").is_file() and not (synthetic_dir / ".cache" / "sweep.db").exists()
    assert f"written to {best}" in out
    study = optuna.load_study(study_name="cli", storage=f"sqlite:///{tmp_path / 'my.db'}")
    assert load_train_config(best) == best_config(study)

    code = cli.main(["train", "--data", str(synthetic_dir), "--config", str(best), "--epochs", "1",
                     "--out", str(tmp_path / "checkpoint")])
    assert code == 0, capsys.readouterr().err
    assert (tmp_path / "checkpoint" / "meta.json").is_file()


def test_cli_sweep_unreachable_database_is_one_line(synthetic_dir, capsys):
    pytest.importorskip("psycopg2")
    code = cli.main(["sweep", "--data", str(synthetic_dir), "--trials", "1",
                     "--storage", "postgresql://nobody:secret@127.0.0.1:1/none"])
    err = capsys.readouterr().err
    assert code == 2
    expected = r"gnn-ptp sweep: error: cannot open the study database postgresql\+psycopg2?://nobody:\*\*\*@"
    assert re.match(expected, err), err
    assert "secret" not in err and len(err.strip().splitlines()) == 1


def test_missing_optuna_names_the_install_command(synthetic_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna", None)  # import optuna -> ImportError
    with pytest.raises(UserError, match=r"pip install 'optuna>=4.0'"):
        sweep(synthetic_dir, 1)


def test_toml_round_trip_of_every_field():
    from gnn_ptp.model import ModelConfig

    cfg = TrainConfig(model=ModelConfig(layer="gatv2", hidden=96, heads=3, norm="graph", readout="pool",
                                        dropout=0.125, precision_aware=False),
                      lr=3.3e-05, weight_decay=0.0, test_families=("gpt2", 'we"ird'), val_families=(),
                      threads=2, memory_weight=0.0)
    import tomllib

    assert TrainConfig.from_dict(tomllib.loads(to_toml(cfg.to_dict()))) == cfg


# --- two workers, one study, a real PostgreSQL server ---------------------------------------------------


def _pg_binary(name: str) -> str | None:
    """On PATH, or where Debian/Ubuntu's postgresql package puts it (/usr/lib/postgresql/<version>/bin)."""
    versions = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"),
                      key=lambda p: [int(n) for n in re.findall(r"\d+", p)])
    return shutil.which(name) or (versions[-1] if versions else None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def postgres_url():
    """A throwaway PostgreSQL server on 127.0.0.1 (trust auth, data in a temp folder), stopped after.

    As root (initdb refuses root) the server runs as the ``postgres`` user via ``runuser``. The folder
    is a fresh ``mkdtemp`` under /tmp, not tmp_path: pytest's folders are not open to that user."""
    initdb, pg_ctl = _pg_binary("initdb"), _pg_binary("pg_ctl")
    if not (initdb and pg_ctl):
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) not found: apt-get install postgresql")
    psycopg2 = pytest.importorskip("psycopg2")
    as_user: list[str] = []
    if os.geteuid() == 0:
        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no 'postgres' user to run the server as")
        if not shutil.which("runuser"):
            pytest.skip("running as root and runuser (util-linux) is missing")
        as_user = ["runuser", "-u", "postgres", "--"]
    root = Path(tempfile.mkdtemp(prefix="gnn-ptp-pg-"))
    data, sockets, log = root / "data", root / "sockets", root / "server.log"
    sockets.mkdir()
    if as_user:
        for path in (root, sockets):
            os.chown(path, user.pw_uid, user.pw_gid)
    port = _free_port()

    def run(*argv) -> None:
        done = subprocess.run(as_user + [str(a) for a in argv], cwd=root, capture_output=True, text=True,
                              timeout=60)
        server_log = log.read_text() if log.exists() else ""
        assert done.returncode == 0, f"{argv[:2]} failed:\n{done.stdout}{done.stderr}{server_log}"

    try:
        run(initdb, "-D", data, "-U", "postgres", "--auth=trust", "--locale=C", "-E", "UTF8", "--no-sync")
        run(pg_ctl, "-D", data, "-l", log, "-w", "-t", "30", "-o", f"-h 127.0.0.1 -p {port} -k {sockets} -F",
            "start")
        conn = psycopg2.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres")
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("CREATE DATABASE optuna")
        conn.close()
        yield f"postgresql://postgres@127.0.0.1:{port}/optuna"
    finally:
        if (data / "postmaster.pid").exists():
            subprocess.run(as_user + [pg_ctl, "-D", str(data), "-m", "fast", "-w", "stop"], cwd=root,
                           capture_output=True, timeout=60)
        shutil.rmtree(root, ignore_errors=True)


def test_two_workers_share_one_postgresql_study(postgres_url, tmp_path):
    import psycopg2

    data = write_synthetic_dataset(tmp_path / "synthetic-cpu")
    workers = [subprocess.Popen(
        [sys.executable, str(TESTS / "sweep_worker.py"), "sweep", "--data", str(data), "--trials", "2",
         "--epochs", "2", "--storage", postgres_url, "--study", "shared", "--seed", str(seed),
         "--threads", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for seed in (1, 2)]
    try:
        outputs = [w.communicate(timeout=120) for w in workers]
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
    numbers = []
    for w, (out, err) in zip(workers, outputs):
        assert w.returncode == 0, err
        numbers.append({int(n) for n in re.findall(r"^trial +(\d+) ", out, flags=re.M)})
    assert len(numbers[0]) == len(numbers[1]) == 2 and not numbers[0] & numbers[1]  # 2 each, none shared

    study = optuna.load_study(study_name="shared", storage=storage_url(postgres_url, data))
    trials = study.get_trials()
    assert sorted(t.number for t in trials) == [0, 1, 2, 3] == sorted(numbers[0] | numbers[1])
    assert {t.state for t in trials} <= FINISHED
    with psycopg2.connect(postgres_url) as conn, conn.cursor() as cur:  # the trials live in that server
        cur.execute("SELECT count(*) FROM trials JOIN studies USING (study_id) WHERE study_name = 'shared'")
        assert cur.fetchone()[0] == 4


def test_a_sweep_draws_only_readouts_its_base_config_can_train():
    """Every readout ``readouts_for`` allows makes a valid config on top of its base (a trial that drew one
    it cannot train would abort the study); the ones it leaves out would not."""
    import dataclasses

    from gnn_ptp.model import READOUTS, ModelConfig
    from gnn_ptp.sweep import readouts_for

    bases = [TrainConfig(), TrainConfig(node_weight=1.0),
             TrainConfig(model=ModelConfig(target="log_ratio_prior")),
             TrainConfig(model=ModelConfig(target="log_ratio_prior", trust_region=True))]
    for base in bases:
        allowed = readouts_for(base)
        for readout in READOUTS:
            try:
                dataclasses.replace(base, model=dataclasses.replace(base.model, readout=readout))
                valid = True
            except UserError:
                valid = False
            assert valid == (readout in allowed), (base, readout)
    assert readouts_for(bases[2]) == READOUTS
