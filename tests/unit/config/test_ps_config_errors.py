"""Invalid ps.json files: each problem is reported at the right place, all of them at once."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from ps_samples import MINIMAL_PS, REALISTIC_PS, problems_of, write_ps

from hps_core.config import load_ps_config, parse_ps_config
from hps_core.config.inert import inert_settings
from hps_core.errors import ConfigError

DELETE = object()


def _set(doc: dict[str, Any], dotted: str, value: Any) -> None:
    """Set (or delete, with ``DELETE``) ``doc`` at a path like ``models.0.gpucacheper``."""
    *parents, last = dotted.split(".")
    node: Any = doc
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    key: Any = int(last) if isinstance(node, list) else last
    if value is DELETE:
        del node[key]
    else:
        node[key] = value


# (edits to REALISTIC_PS, where the problem is reported, text the message must contain)
SINGLE_PROBLEM_CASES = [
    (
        {"models.0.embedding_vecsize_per_table.1": 0},
        "models[0].embedding_vecsize_per_table[1]",
        "expected an integer >= 1, found 0",
    ),
    ({"models.0.gpucacheper": 1.5}, "models[0].gpucacheper", "a number in [0, 1], found 1.5"),
    ({"models.0.hit_rate_threshold": -0.1}, "models[0].hit_rate_threshold", "a number >= 0"),
    ({"models.0.gpucache": 1}, "models[0].gpucache", "expected true or false, found 1"),
    ({"models.0.gpucache": "yes"}, "models[0].gpucache", 'true or false, found the string "yes"'),
    ({"models.0.gpucacheper": "half"}, "models[0].gpucacheper", "in [0, 1], found the string"),
    ({"models.0.max_batch_size": "64.5"}, "models[0].max_batch_size", "truncate it to 64"),
    ({"models.0.max_batch_size": 64.5}, "models[0].max_batch_size", "truncate it to 64"),
    ({"models.0.max_batch_size": True}, "models[0].max_batch_size", "integer >= 1, found true"),
    ({"models.0.refresh_interval": 1.5}, "models[0].refresh_interval", "truncate it to 1"),
    (
        {"models.0.default_value_for_each_table.1": float("nan")},
        "models[0].default_value_for_each_table[1]",
        "found NaN",
    ),
    (
        {"models.0.cache_refresh_percentage_per_iteration": 2},
        "models[0].cache_refresh_percentage_per_iteration",
        "in [0, 1], found 2",
    ),
    ({"models.0.model": ""}, "models[0].model", "non-empty string, found an empty string"),
    ({"models.0.model": DELETE}, "models[0].model", "missing"),
    ({"models.1.model": "wdl"}, "models[1].model", 'duplicate model name "wdl"'),
    ({"models.0.sparse_files": "a"}, "models[0].sparse_files", 'a list, found the string "a"'),
    ({"models.0.sparse_files.1": "ftp://host/t1"}, "models[0].sparse_files[1]", "unsupported URL"),
    ({"models.0.sparse_files.1": ""}, "models[0].sparse_files[1]", "non-empty string"),
    ({"models.0.deployed_device_list": DELETE}, "models[0].deployed_device_list", "missing"),
    ({"models.0.deployed_device_list": []}, "models[0].deployed_device_list", "at least one"),
    ({"models.1.deployed_device_list": [1, 1]}, "models[1].deployed_device_list[1]", "twice"),
    (
        {"models.0.deployed_device_list": [-1]},
        "models[0].deployed_device_list[0]",
        "integer >= 0, found -1",
    ),
    (
        {"models.0.embedding_table_names": ["wide", 3]},
        "models[0].embedding_table_names[1]",
        "expected a non-empty string, found 3",
    ),
    (
        {"models.0.embedding_table_names": ["t", "t"]},
        "models[0].embedding_table_names[1]",
        'duplicate table name "t"',
    ),
    (
        {"models.0.maxnum_catfeature_query_per_table_per_sample": [2]},
        "models[0].maxnum_catfeature_query_per_table_per_sample",
        "has 1 entry but sparse_files lists 2 tables",
    ),
    (
        {"models.0.embedding_vecsize_per_table": [1, 16, 8]},
        "models[0].embedding_vecsize_per_table",
        "has 3 entries but sparse_files lists 2 tables",
    ),
    (
        {"models.0.embedding_table_names": ["wide"]},
        "models[0].embedding_table_names",
        "has 1 entry",
    ),
    ({"models.0.sparse_files": []}, "models[0].sparse_files", "at least one sparse model"),
    ({"models.0.dense_file": None}, "models[0].dense_file", "found null (leave the key out"),
    (
        {"models.0.embedding_cache_type": "static_table"},
        "models[0].embedding_cache_type",
        'unknown value "static_table" (did you mean "static"?)',
    ),
    (
        {"models.1.use_static_table": True},
        "models[1].embedding_cache_type",
        'contradicts "use_static_table": true',
    ),
    ({"models.0": 3}, "models[0]", "expected an object {...}, found 3"),
    ({"models": []}, "models", "at least one model"),
    ({"models": {}}, "models", "expected a list, found an object"),
    ({"supportlonglong": DELETE}, "supportlonglong", "requires it"),
    ({"fuse_embedding_table": 0}, "fuse_embedding_table", "true or false, found 0"),
    (
        {"volatile_db.type": "redis_clster"},
        "volatile_db.type",
        '(did you mean "redis_cluster"?)',
    ),
    ({"volatile_db.type": "rocks_db"}, "volatile_db.type", "not allowed here"),
    ({"volatile_db.overflow_policy": "lru"}, "volatile_db.overflow_policy", '"evict_oldest"'),
    (
        {"volatile_db.overflow_resolution_target": 1.0},
        "volatile_db.overflow_resolution_target",
        "in (0, 1), found 1.0",
    ),
    ({"volatile_db.initial_cache_rate": 1.5}, "volatile_db.initial_cache_rate", "in [0, 1]"),
    ({"volatile_db.num_partitions": 0}, "volatile_db.num_partitions", ">= 1, found 0"),
    ({"volatile_db.update_filters": ["("]}, "volatile_db.update_filters[0]", "regular expr"),
    ({"volatile_db.address": ""}, "volatile_db.address", "non-empty string"),
    ({"volatile_db": []}, "volatile_db", "expected an object {...}, found a list of 0 items"),
    ({"persistent_db.type": "redis"}, "persistent_db.type", '"disabled", "rocks_db"'),
    ({"persistent_db.num_threads": 0}, "persistent_db.num_threads", ">= 1, found 0"),
    ({"persistent_db.read_only": "no"}, "persistent_db.read_only", "true or false"),
    ({"update_source.type": "kafak"}, "update_source.type", '(did you mean "kafka"?)'),
    (
        {"update_source.poll_timeout_ms": 0},
        "update_source.poll_timeout_ms",
        "in [1, 2147483646], found 0",
    ),
]


@pytest.mark.parametrize(("edits", "where", "fragment"), SINGLE_PROBLEM_CASES)
def test_single_problem_is_reported_where_it_is(edits, where, fragment):
    doc = copy.deepcopy(REALISTIC_PS)
    for dotted, value in edits.items():
        _set(doc, dotted, value)

    problems = problems_of(doc)

    assert [p.where for p in problems] == [where], problems
    assert fragment in problems[0].message


def test_all_problems_are_reported_together(tmp_path):
    doc = copy.deepcopy(REALISTIC_PS)
    edits = {
        "models.0.embedding_vecsize_per_table.1": 0,
        "models.0.gpucacheper": "1.5",
        "models.0.gpucache": 1,
        "models.0.max_batch_size": 64.5,
        "models.1.deployed_device_list": [],
        "volatile_db.type": "redis_clster",
        "persistent_db.num_threads": 0,
    }
    for dotted, value in edits.items():
        _set(doc, dotted, value)

    with pytest.raises(ConfigError) as info:
        load_ps_config(write_ps(tmp_path, doc))

    assert {p.where for p in info.value.problems} == {
        "models[0].embedding_vecsize_per_table[1]",
        "models[0].gpucacheper",
        "models[0].gpucache",
        "models[0].max_batch_size",
        "models[1].deployed_device_list",
        "volatile_db.type",
        "persistent_db.num_threads",
    }
    assert len(info.value.problems) == len(edits)
    text = str(info.value)
    assert text.count("\n") == len(edits) - 1
    assert "volatile_db.type: unknown value" in text


def test_problems_in_several_models_name_each_model(minimal):
    second = copy.deepcopy(minimal["models"][0])
    second["model"] = "tiny2"
    second["embedding_vecsize_per_table"] = [-3]
    minimal["models"][0]["gpucacheper"] = -1
    minimal["models"].append(second)

    problems = problems_of(minimal)

    assert [p.where for p in problems] == [
        "models[0].gpucacheper",
        "models[1].embedding_vecsize_per_table[0]",
    ]


@pytest.mark.parametrize(
    ("section", "key"),
    [("models.0", k) for k in MINIMAL_PS["models"][0]]
    + [("models.0", k) for k in ("gpucacheper", "init_ec", "embedding_table_names")]
    + [("models.0", k) for k in ("num_of_worker_buffer_in_pool", "refresh_interval")]
    + [("volatile_db", k) for k in ("overflow_margin", "initial_cache_rate", "update_filters")]
    + [("persistent_db", k) for k in ("num_threads", "read_only")]
    + [("update_source", k) for k in ("brokers", "poll_timeout_ms")],
)
def test_misspelt_key_gets_a_suggestion(minimal, section, key):
    doc = copy.deepcopy(minimal)
    doc.setdefault("volatile_db", {})
    doc.setdefault("persistent_db", {})
    doc.setdefault("update_source", {})
    node = doc["models"][0] if section == "models.0" else doc[section]
    typo = key[:2] + "x" + key[2:]
    node[typo] = node.pop(key, 1)

    problems = problems_of(doc)

    where = ("models[0]" if section == "models.0" else section) + "." + typo
    (unknown,) = [p for p in problems if p.where == where]
    assert f'did you mean "{key}"?' in unknown.message


def test_unrelated_unknown_key_lists_the_known_keys(minimal):
    minimal["persistent_db"] = {"type": "rocks_db", "colour": "blue"}

    (problem,) = problems_of(minimal)

    assert problem.where == "persistent_db.colour"
    assert problem.message.startswith("unknown key; known keys here: ")
    assert "num_threads" in problem.message and "read_only" in problem.message


@pytest.mark.parametrize(
    ("key", "ps_key"),
    [
        ("sparse_model_files", "sparse_files"),
        ("deployed_devices", "deployed_device_list"),
        ("cache_size_percentage", "gpucacheper"),
        ("number_of_worker_buffers_in_pool", "num_of_worker_buffer_in_pool"),
    ],
)
def test_python_api_names_point_to_the_ps_json_key(minimal, key, ps_key):
    minimal["models"][0][key] = minimal["models"][0].get(ps_key, 1)

    (problem,) = problems_of(minimal)

    assert problem.where == f"models[0].{key}"
    assert f'in ps.json write "{ps_key}"' in problem.message


def test_keys_in_the_wrong_section_say_where_they_belong(minimal):
    minimal["models"][0]["supportlonglong"] = True
    minimal["gpucacheper"] = 0.5

    problems = {p.where: p.message for p in problems_of(minimal)}

    assert "belongs at the top level" in problems["models[0].supportlonglong"]
    assert 'belongs inside an entry of "models"' in problems["gpucacheper"]


def test_root_must_be_an_object():
    (problem,) = problems_of([MINIMAL_PS])

    assert problem.where == "ps.json"
    assert "expected an object {...}, found a list of 1 item" in problem.message


def test_a_key_repeated_with_another_value_takes_the_last_with_one_warning(tmp_path, minimal):
    """HugeCTR's JSON reader takes the last value of a repeated key (its hps-triton-ensemble
    sample repeats num_of_refresher_buffer_in_pool, 1 then 0): so here, with one warning
    naming the key, the file and the value taken."""
    minimal["volatile_db"] = {"type": "hash_map"}
    path = write_ps(tmp_path, minimal)
    path.write_text(
        path.read_text()
        .replace('"model": "tiny",', '"gpucache": true, "model": "tiny", "gpucache": false,')
        .replace('"type": "hash_map"', '"type": "hash_map", "type": "parallel_hash_map"')
    )

    config = load_ps_config(path)

    assert config.models[0].gpucache is False
    assert config.volatile_db.type.value == "parallel_hash_map"
    assert config.repeated_keys == (
        ("volatile_db.type", ("hash_map", "parallel_hash_map")),
        ("models[0].gpucache", (True, False)),
    )
    assert inert_settings(config) == [
        f'volatile_db.type is given 2 times in {path} ("hash_map" then "parallel_hash_map"): '
        '"parallel_hash_map" is taken, the last, as HugeCTR\'s JSON reader takes it; keep '
        "only the one you mean",
        f"models[0].gpucache is given 2 times in {path} (true then false): false is taken, the "
        "last, as HugeCTR's JSON reader takes it; keep only the one you mean",
    ]


def test_a_key_repeated_with_the_same_value_is_not_warned_about(tmp_path, minimal):
    path = write_ps(tmp_path, minimal)
    path.write_text(
        path.read_text().replace('"model": "tiny",', '"model": "tiny", "model": "tiny",')
    )
    config = load_ps_config(path)
    assert config.repeated_keys == () and inert_settings(config) == []


@pytest.mark.parametrize(
    "key", ["num_of_worker_buffer_in_pool", "num_of_refresher_buffer_in_pool", "thread_pool_size"]
)
def test_zero_for_a_count_without_effect_here_is_accepted_with_one_warning(minimal, key):
    """HugeCTR's parser takes 0 for these counts; they change nothing here: accepted, and
    warned about once, as any value other than HugeCTR's default of such a field."""
    minimal["models"][0][key] = 0
    config = parse_ps_config(minimal, "/repo")
    assert getattr(config.models[0], key) == 0
    (line,) = inert_settings(config)
    assert line.startswith(f"models[0].{key} = 0 (model 'tiny'): accepted without effect: ")
    minimal["models"][0][key] = -1  # HugeCTR would wrap it around to a huge count
    (problem,) = problems_of(minimal)
    assert problem.where == f"models[0].{key}" and "an integer >= 0, found -1" in problem.message


@pytest.mark.parametrize(
    ("text", "line", "column", "fragment"),
    [
        ('{\n  "supportlonglong": true\n  "models": []\n}\n', 3, 3, "Expecting ','"),
        ('{\n  "supportlonglong": true, // 64-bit keys\n  "models": []\n}\n', 2, 28, "comments"),
        ('{\n  "models": [],\n}\n', 3, 1, "trailing comma"),
        ('{"models": [1, 2,]}', 1, 18, "trailing comma"),
        ("", 1, 1, "Expecting value"),
    ],
)
def test_malformed_json_names_file_line_and_column(tmp_path, text, line, column, fragment):
    path = tmp_path / "ps.json"
    path.write_text(text)

    with pytest.raises(ConfigError) as info:
        load_ps_config(path)

    (problem,) = info.value.problems
    assert problem.where == f"{path}:{line}:{column}"
    assert problem.message.startswith("malformed JSON: ")
    assert fragment in problem.message


def test_a_byte_order_mark_is_skipped_as_hugectr_skips_it(tmp_path):
    good = write_ps(tmp_path, MINIMAL_PS, "good.json")
    with_bom = tmp_path / "ps.json"
    with_bom.write_bytes(b"\xef\xbb\xbf" + good.read_bytes())
    assert load_ps_config(with_bom).to_dict() == load_ps_config(good).to_dict()


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_ps_config(tmp_path / "nope" / "ps.json")

    (problem,) = info.value.problems
    assert problem.where == str(tmp_path / "nope" / "ps.json")
    assert "no such file" in problem.message


def test_folder_instead_of_file(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_ps_config(tmp_path)

    assert "is a folder" in info.value.problems[0].message


def test_non_utf8_file(tmp_path):
    path = tmp_path / "ps.json"
    path.write_bytes(b'{"models": "\xff"}')

    with pytest.raises(ConfigError) as info:
        load_ps_config(path)

    assert "not UTF-8" in info.value.problems[0].message


def test_valid_config_after_fixing_reported_problem(minimal):
    minimal["models"][0]["gpucacheper"] = 2.0
    assert [p.where for p in problems_of(minimal)] == ["models[0].gpucacheper"]

    minimal["models"][0]["gpucacheper"] = 1.0
    assert parse_ps_config(minimal, "/repo").model("tiny").gpucacheper == 1.0


@pytest.mark.parametrize(
    ("edits", "field", "value"),
    [
        ({"models.0.gpucacheper": "0.5"}, "gpucacheper", 0.5),
        ({"models.0.hit_rate_threshold": " 0.9 "}, "hit_rate_threshold", 0.9),
        ({"models.0.max_batch_size": "64"}, "max_batch_size", 64),
        ({"models.0.gpucache": "True"}, "gpucache", True),
        ({"models.0.gpucache": "FALSE"}, "gpucache", False),
        ({"models.0.gpucache": "0"}, "gpucache", False),
        ({"models.0.gpucache": "1"}, "gpucache", True),
        ({"supportlonglong": "true"}, "supportlonglong", True),
    ],
)
def test_quoted_numbers_and_booleans_read_as_hugectrs_triton_backends_read_them(
    tmp_path, edits, field, value
) -> None:
    """The hps and hugectr backends fall back to the string where they expect a number or a
    boolean (true/false in any case, else stoll/stod): HugeCTR's own samples quote some."""
    doc = copy.deepcopy(REALISTIC_PS)
    for dotted, new in edits.items():
        _set(doc, dotted, new)
    config = load_ps_config(write_ps(tmp_path, doc))
    holder = config if field == "supportlonglong" else config.models[0]
    got = getattr(holder, field)
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize(
    ("dotted", "spelling", "read"),
    [
        ("volatile_db.type", "Redis-Cluster", ("volatile_db", "type", "redis_cluster")),
        ("volatile_db.overflow_policy", "Evict Random",
         ("volatile_db", "overflow_policy", "evict_random")),
        ("models.1.embedding_cache_type", "Static", ("models", "embedding_cache_type", "static")),
    ],
)  # fmt: skip
def test_names_are_read_in_any_case_with_spaces_or_dashes_for_underscores(
    tmp_path, dotted, spelling, read
) -> None:
    """As HugeCTR's Triton backends read an enum: lowercased, ' ' and '-' as '_'."""
    doc = copy.deepcopy(REALISTIC_PS)
    _set(doc, dotted, spelling)
    if dotted.startswith("models.1"):
        doc["models"][1].pop("use_static_table", None)
    config = load_ps_config(write_ps(tmp_path, doc))
    section, field, value = read
    holder = config.models[1] if section == "models" else getattr(config, section)
    assert getattr(holder, field).value == value


def test_hit_rate_threshold_is_said_inert_below_1(minimal):
    """The cache bank, every model's GPU engine, answers every miss with its true row
    whatever the hit rate: a threshold below 1 asks for what it does not do."""
    minimal["models"][0]["hit_rate_threshold"] = 0.5
    for network in (False, True):  # embedding-lookup and ranking models alike
        if network:
            minimal["models"][0]["network_file"] = "net.json"
            minimal["models"][0]["dense_file"] = "dense.model"
        (line,) = inert_settings(parse_ps_config(minimal, "/repo"))
        said = "models[0].hit_rate_threshold = 0.5 (model 'tiny'): accepted without effect: sets"
        assert line.startswith(said + " the batch hit rate below which HugeCTR inserts")
    for same in (0.9, 1.0, 1.1):  # HugeCTR's default, or true rows for every miss as here
        minimal["models"][0]["hit_rate_threshold"] = same
        assert inert_settings(parse_ps_config(minimal, "/repo")) == []
