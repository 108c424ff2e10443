"""Settings from the environment: every setting has a variable (tests/packaging/test_docs.py checks the settings page against the model),
unknown variables and bad values are one-line ConfigErrors naming the variable and the value."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest

from memory_lib.core.config import (
    ENV_ALIASES,
    ArchivalCriteria,
    Settings,
    default_state_dir,
    env_names,
    nested_env_name,
    setting_paths,
)
from memory_lib.core.errors import ConfigError, MemoryArchiveError

ROOT = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- every setting from the environment


def test_every_setting_has_an_accepted_nested_variable():
    paths = setting_paths()
    assert ("archival", "min_age_days") in paths and ("embedding", "dim") in paths
    for path in paths:
        assert env_names()[nested_env_name(path)] == path


def test_archival_criteria_from_the_environment():
    env = {
        "MEMORY_ARCHIVE_ARCHIVAL__MIN_AGE_DAYS": "120",
        "MEMORY_ARCHIVE_ARCHIVAL__MAX_IMPORTANCE_SCORE": "0.25",
        "MEMORY_ARCHIVE_ARCHIVAL__MAX_RECENT_ACCESS_COUNT": "5",
        "MEMORY_ARCHIVE_ARCHIVAL__RECENT_ACCESS_WINDOW_DAYS": "14",
        "MEMORY_ARCHIVE_ARCHIVAL__FORCE_ARCHIVE_AGE_DAYS": "400",
        "MEMORY_ARCHIVE_ARCHIVAL__BATCH_SIZE": "100",
        "MEMORY_ARCHIVE_ARCHIVAL__EXEMPT_CATEGORIES": "core, procedural",
        "MEMORY_ARCHIVE_ARCHIVAL__MAX_ERROR_RATE": "0.1",
        "MEMORY_ARCHIVE_ARCHIVAL__MAX_ATTEMPTS": "4",
    }
    assert Settings.from_env(env).archival == ArchivalCriteria(
        min_age_days=120,
        max_importance_score=0.25,
        max_recent_access_count=5,
        recent_access_window_days=14,
        force_archive_age_days=400,
        batch_size=100,
        exempt_categories=("core", "procedural"),
        max_error_rate=0.1,
        max_attempts=4,
    )
    as_json = {"MEMORY_ARCHIVE_ARCHIVAL__EXEMPT_CATEGORIES": '["core", "semantic"]'}
    assert Settings.from_env(as_json).archival.exempt_categories == ("core", "semantic")


def test_short_names_keep_working():
    env = {
        "DATABASE_URL": "postgresql://app@db.internal:5432/memories",
        "MEMORY_ARCHIVE_STATE_DIR": "/var/lib/ma",
        "MEMORY_ARCHIVE_EMBEDDED_DB": "memory_demo",
        "MEMORY_ARCHIVE_SUMMARIZER": "extractive",
        "MEMORY_ARCHIVE_LLM_BASE_URL": "http://127.0.0.1:8080/v1",
        "MEMORY_ARCHIVE_LLM_RPS": "2.5",
        "MEMORY_ARCHIVE_EMBEDDER": "hashing",
        "MEMORY_ARCHIVE_EMBEDDING_DIM": "384",
        "MEMORY_ARCHIVE_EMBEDDING_BASE_URL": "https://emb.example.com",
        "MEMORY_ARCHIVE_BUCKET": "agent-memories",
        "MEMORY_ARCHIVE_PREFIX": "/prod/memory-archive/",
        "MEMORY_ARCHIVE_S3_ENDPOINT_URL": "http://127.0.0.1:8333",
        "MEMORY_ARCHIVE_LOCAL_ROOT": "/srv/objects",
        "AWS_REGION": "eu-west-1",
        "MEMORY_ARCHIVE_PARTITION_START": "2026-02-01",
        "MEMORY_ARCHIVE_TIMEZONE": "Europe/Lisbon",
        "MEMORY_ARCHIVE_POLICY": "retention",
        "ANTHROPIC_API_KEY": "sk-ant-key",
        "OPENAI_API_KEY": "sk-key",
        "ANTHROPIC_BASE_URL": "https://anthropic.example.com",
        "OPENAI_BASE_URL": "https://openai.example.com/v1",
    }
    s = Settings.from_env(env)
    assert s.database_url is not None
    assert s.database_url.get_secret_value() == env["DATABASE_URL"]
    assert (s.state_dir, s.embedded_database) == (Path("/var/lib/ma"), "memory_demo")
    assert (s.llm.provider, s.llm.base_url, s.llm.requests_per_second) == (
        "extractive",
        "http://127.0.0.1:8080/v1",
        2.5,
    )
    assert (s.embedding.provider, s.embedding.dim, s.embedding.base_url) == (
        "hashing",
        384,
        "https://emb.example.com",
    )
    store = s.object_store
    assert (
        store.kind,
        store.bucket,
        store.prefix,
        store.endpoint_url,
        store.local_root,
        store.region_name,
    ) == (
        "s3",
        "agent-memories",
        "prod/memory-archive",
        "http://127.0.0.1:8333",
        Path("/srv/objects"),
        "eu-west-1",
    )
    assert (s.slow_path.partition_start_date, s.slow_path.timezone) == (date(2026, 2, 1), "Europe/Lisbon")
    assert s.archival.policy == "retention"
    assert s.llm.anthropic_api_key is not None and s.llm.anthropic_api_key.get_secret_value() == "sk-ant-key"
    assert s.llm.openai_api_key is not None and s.llm.openai_api_key.get_secret_value() == "sk-key"
    assert (s.llm.anthropic_base_url, s.llm.openai_base_url) == (
        "https://anthropic.example.com",
        "https://openai.example.com/v1",
    )
    # Every short name but MEMORY_ARCHIVE_OBJECT_STORE (implied by the bucket here) is set above.
    assert set(ENV_ALIASES) - set(env) == {"MEMORY_ARCHIVE_OBJECT_STORE"}
    assert (
        Settings.from_env(
            {"MEMORY_ARCHIVE_OBJECT_STORE": "s3", "MEMORY_ARCHIVE_BUCKET": "b"}
        ).object_store.kind
        == "s3"
    )


def test_kind_given_wins_over_bucket_and_empty_means_unset():
    s = Settings.from_env(
        {"MEMORY_ARCHIVE_BUCKET": "b-1", "MEMORY_ARCHIVE_OBJECT_STORE": "local", "DATABASE_URL": ""}
    )
    assert (s.object_store.kind, s.database_url) == ("local", None)


def test_overrides_merge_into_the_environment():
    s = Settings.from_env(
        {"MEMORY_ARCHIVE_EMBEDDER": "hashing", "MEMORY_ARCHIVE_EMBEDDING_DIM": "64"},
        embedding={"dim": 32},
        embedded_database="memory_t",
    )
    assert (s.embedding.provider, s.embedding.dim, s.embedded_database) == ("hashing", 32, "memory_t")


def test_plain_constructor_never_reads_the_environment(monkeypatch):
    monkeypatch.setenv("MEMORY_ARCHIVE_EMBEDDING_DIM", "64")
    monkeypatch.setenv("MEMORY_ARCHIVE_TYPO", "x")
    assert Settings().embedding.dim == 1536 and Settings(state_dir="s").embedding.dim == 1536
    assert Settings.from_env({"MEMORY_ARCHIVE_EMBEDDING_DIM": "64"}).embedding.dim == 64
    with pytest.raises(ConfigError, match="MEMORY_ARCHIVE_TYPO"):
        Settings.from_env()  # os.environ by default


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "name,hint",
    [
        ("MEMORY_ARCHIVE_EMBEDING_DIM", "MEMORY_ARCHIVE_EMBEDDING_DIM"),
        ("MEMORY_ARCHIVE_BATCH_SIZE", "MEMORY_ARCHIVE_ARCHIVAL__BATCH_SIZE"),
        ("MEMORY_ARCHIVE_ARCHIVAL__MIN_AGE", "MEMORY_ARCHIVE_ARCHIVAL__MIN_AGE_DAYS"),
        ("MEMORY_ARCHIVE_ARCHIVAL", None),  # a whole section is not a variable
        ("memory_archive_llm_rsp", "MEMORY_ARCHIVE_LLM_RPS"),
    ],
)
def test_unknown_variables_are_errors_naming_them(name, hint):
    with pytest.raises(ConfigError) as info:
        Settings.from_env({name: "10"})
    message = str(info.value)
    assert f"unknown environment variable {name}" in message and "\n" not in message
    if hint:
        assert f"did you mean {hint}?" in message
    assert info.value.variable == name and isinstance(info.value, MemoryArchiveError)


def test_other_prefixes_are_not_ours():
    assert (
        Settings.from_env({"MEMORY_ARCHIVER": "x", "PATH": "/bin", "DAGSTER_HOME": "/tmp"}).embedding.dim
        == 1536
    )


@pytest.mark.parametrize(
    "name,value,reason",
    [
        ("MEMORY_ARCHIVE_LLM_RPS", "inf", "finite"),
        ("MEMORY_ARCHIVE_LLM_RPS", "nan", "finite"),
        ("MEMORY_ARCHIVE_LLM_RPS", "0", "greater than 0"),
        ("MEMORY_ARCHIVE_LLM_RPS", "1e9", "less than or equal"),
        ("MEMORY_ARCHIVE_RETRIEVAL__ACTIVE_BOOST", "inf", "finite"),
        ("MEMORY_ARCHIVE_ARCHIVAL__MAX_ERROR_RATE", "1.5", "less than or equal to 1"),
        ("MEMORY_ARCHIVE_ARCHIVAL__BATCH_SIZE", "501", "less than or equal to 500"),
        (
            "MEMORY_ARCHIVE_ARCHIVAL__MIN_AGE_DAYS",
            "400",
            "force_archive_age_days=365 must be >= min_age_days=400",
        ),
        ("MEMORY_ARCHIVE_ARCHIVAL__EXEMPT_CATEGORIES", "[core", "Expecting"),
        ("MEMORY_ARCHIVE_EMBEDDING_DIM", "zero", "valid integer"),
        ("MEMORY_ARCHIVE_EMBEDDER", "bert", "'auto', 'openai', 'local' or 'hashing'"),
        ("MEMORY_ARCHIVE_PREFIX", "../../etc", "'..'"),
        ("MEMORY_ARCHIVE_PREFIX", "a//b", "empty"),
        ("MEMORY_ARCHIVE_PREFIX", "a/./b", "'.'"),
        ("MEMORY_ARCHIVE_PREFIX", "memories\\x", "segments"),
        ("MEMORY_ARCHIVE_S3_ENDPOINT_URL", "not a url", "http:// or https:// URL"),
        ("MEMORY_ARCHIVE_S3_ENDPOINT_URL", "ftp://host", "http:// or https:// URL"),
        ("MEMORY_ARCHIVE_S3_ENDPOINT_URL", "http://host:99999", "Port out of range"),
        ("MEMORY_ARCHIVE_LLM_BASE_URL", "localhost:8080", "http:// or https:// URL"),
        ("MEMORY_ARCHIVE_EMBEDDING_BASE_URL", "http://", "http:// or https:// URL"),
        ("MEMORY_ARCHIVE_BUCKET", "My_Bucket", "pattern"),
        ("MEMORY_ARCHIVE_EMBEDDED_DB", "demo; DROP", "pattern"),
        ("DATABASE_URL", "not a url", "postgresql:// URL or a libpq"),
        ("DATABASE_URL", "mysql://db/x", "postgresql:// URL or a libpq"),
        ("MEMORY_ARCHIVE_TIMEZONE", "Mars/Olympus", "not a known IANA time zone"),
        ("MEMORY_ARCHIVE_PARTITION_START", "yesterday", "valid date"),
        ("MEMORY_ARCHIVE_CONTEXT__TOTAL", "1000", "more than total=1000"),
        ("MEMORY_ARCHIVE_POLICY", "lru", "'adr004' or 'retention'"),
        ("MEMORY_ARCHIVE_ARCHIVAL__COLD_MIGRATION_DAYS", "0", "greater than or equal to 1"),
        ("MEMORY_ARCHIVE_RETENTION__CORE_FLOOR", "1", "less than 1"),
        ("MEMORY_ARCHIVE_RETENTION__EPISODIC_HALF_LIFE_DAYS", "0", "greater than 0"),
    ],
)
def test_bad_values_name_the_variable_and_the_value(name, value, reason):
    with pytest.raises(ConfigError) as info:
        Settings.from_env({name: value})
    message = str(info.value)
    assert f"{name}={value!r}" in message and reason in message, message
    assert "\n" not in message
    assert (info.value.variable, info.value.value) == (name, value)


def test_a_password_is_never_shown():
    with pytest.raises(ConfigError) as info:
        Settings.from_env({"DATABASE_URL": "postgresql://app:hunter2@db:notaport/x"})
    assert "hunter2" not in str(info.value) and "DATABASE_URL='postgresql://app:***@db:notaport/x'" in str(
        info.value
    )
    with pytest.raises(ConfigError) as info:
        Settings.from_env(
            {"DATABASE_URL": "host=db password=hunter2", "MEMORY_ARCHIVE_DATABASE_URL": "host=db"}
        )
    assert "hunter2" not in str(info.value) and "both set database_url" in str(info.value)
    assert "hunter2" not in repr(Settings.from_env({"DATABASE_URL": "postgresql://u:hunter2@h/db"}))


def test_two_names_of_one_setting_must_agree():
    with pytest.raises(
        ConfigError, match="MEMORY_ARCHIVE_EMBEDDING_DIM='64' and MEMORY_ARCHIVE_EMBEDDING__DIM='32'"
    ):
        Settings.from_env({"MEMORY_ARCHIVE_EMBEDDING_DIM": "64", "MEMORY_ARCHIVE_EMBEDDING__DIM": "32"})
    same = {"MEMORY_ARCHIVE_EMBEDDING_DIM": "64", "MEMORY_ARCHIVE_EMBEDDING__DIM": "64"}
    assert Settings.from_env(same).embedding.dim == 64


def test_bad_override_names_the_setting():
    with pytest.raises(ConfigError, match=r"embedding\.dim"):
        Settings.from_env({}, embedding={"dim": 0})


def test_cli_prints_one_line_for_a_configuration_error(monkeypatch, capsys):
    from memory_lib.cli import main

    monkeypatch.setenv("MEMORY_ARCHIVE_EMBEDING_DIM", "384")
    assert main(["stats"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "MEMORY_ARCHIVE_EMBEDING_DIM" in err and "Traceback" not in err


def test_dagster_archival_criteria_come_from_the_environment(monkeypatch):
    from memory_assets.resources import ArchivalCriteriaResource

    monkeypatch.setenv("MEMORY_ARCHIVE_ARCHIVAL__MIN_AGE_DAYS", "120")
    monkeypatch.setenv("MEMORY_ARCHIVE_ARCHIVAL__EXEMPT_CATEGORIES", "core,procedural")
    criteria = ArchivalCriteriaResource(max_error_rate=0.1).get_criteria()
    assert (criteria.min_age_days, criteria.exempt_categories, criteria.max_error_rate) == (
        120,
        ("core", "procedural"),
        0.1,
    )


# --------------------------------------------------------------------------- state dir


def test_state_dir_is_the_same_from_any_folder(tmp_path, monkeypatch):
    # memory_lib runs from this checkout: its .state, wherever the command runs.
    assert default_state_dir() == ROOT / ".state"
    monkeypatch.chdir(tmp_path)
    assert Settings.from_env({}).state_dir == ROOT / ".state"
    # An explicit relative MEMORY_ARCHIVE_STATE_DIR is taken from the folder it is read in, once.
    s = Settings.from_env({"MEMORY_ARCHIVE_STATE_DIR": "mine"})
    monkeypatch.chdir(ROOT)
    assert (
        s.state_dir == tmp_path.resolve() / "mine" and s.embedded_pg_dir == tmp_path.resolve() / "mine" / "pg"
    )


def test_llm_prices_from_the_environment_replace_the_table():
    from memory_lib.core.config import Settings
    from memory_lib.core.errors import ConfigError

    table = '{"claude-3-haiku": {"input": 0.25, "output": 1.25, "batch_input": 0.125, "batch_output": 0.625}}'
    settings = Settings.from_env({"MEMORY_ARCHIVE_LLM__PRICES": table})
    assert list(settings.llm.prices) == ["claude-3-haiku"]
    assert settings.llm.prices["claude-3-haiku"].batch_output == 0.625
    with pytest.raises(ConfigError, match="MEMORY_ARCHIVE_LLM__PRICES"):
        Settings.from_env(
            {
                "MEMORY_ARCHIVE_LLM__PRICES": '{"m": {"input": -1, "output": 1, "batch_input": 0, "batch_output": 0}}'
            }
        )
