"""Each engine's settings table (recipe key -> flag -> resolved-args name -> expectation) against
the engine's own parser: every flag exists there and lands in the destination the table names, so
the argv, the managed destinations and the expected server args, all read from it, agree."""

from __future__ import annotations

import pytest

from sparkit.contract.flag_table import SHARED, SPECULATIVE_DEFAULTS, SPECULATIVE_NUMBERS, managed_dests
from sparkit.engines.embedded import settings as embedded_settings
from sparkit.engines.embedded.adapter import embedded_arg_parser
from sparkit.engines.sglang import flags as sglang_flags
from sparkit.recipes.schema import Recipe

TABLES = {"sglang": sglang_flags.SETTINGS, "embedded": embedded_settings.SETTINGS}


def _recipe_has(key: str) -> bool:
    model: type = Recipe
    for part in key.split("."):
        field = model.model_fields.get(part)
        if field is None:
            return False
        model = field.annotation if isinstance(field.annotation, type) else model
    return True


@pytest.mark.parametrize("engine", TABLES)
def test_every_row_names_a_recipe_key(engine):
    missing = [row.key for row in TABLES[engine] if not _recipe_has(row.key)]
    assert not missing


def test_every_sglang_flag_lands_where_the_table_says():
    from sparkit.engines.sglang.adapter import parser_facts

    facts = parser_facts()
    if facts.unavailable:
        pytest.skip(facts.unavailable)
    wrong = {row.flag: (row.dest, getattr(facts.exact_option(row.flag), "dest", None))
             for row in sglang_flags.SETTINGS if row.flag and getattr(facts.exact_option(row.flag), "dest", None) != row.dest}
    assert not wrong


def test_every_embedded_flag_lands_where_the_table_says():
    parser = embedded_arg_parser()
    dests = {option: action.dest for action in parser._actions for option in action.option_strings}
    wrong = {row.flag: (row.dest, dests.get(row.flag)) for row in embedded_settings.SETTINGS if row.flag and dests.get(row.flag) != row.dest}
    assert not wrong


def test_both_tables_keep_the_shared_names_and_labels():
    """A shared setting is resolved, expected and shown under SHARED's name on every engine."""
    for engine, table in TABLES.items():
        for row in table:
            if row.key in SHARED and row.dest == SHARED[row.key].dest:
                assert row.label == SHARED[row.key].label, (engine, row.key)


def test_each_resolved_arg_is_labelled_by_one_declaration():
    """The label screens show for a resolved arg is declared once: on one engine's row, or on the
    shared row both engines take up (two engines labelling the same name would be two statements
    of it, free to drift)."""
    tables_labelling: dict[str, set[str]] = {}
    for engine, table in TABLES.items():
        for row in table:
            if row.label:
                tables_labelling.setdefault(row.dest, set()).add(engine)
    shared_dests = {row.dest for row in SHARED.values()}
    twice = {dest: engines for dest, engines in tables_labelling.items() if len(engines) > 1 and dest not in shared_dests}
    assert not twice


def test_a_pass_through_flag_that_fights_a_row_is_refused_by_its_key():
    """MANAGED_DESTS is the table's managed rows: dropping a row's flag from the table frees it."""
    assert sglang_flags.MANAGED_DESTS == managed_dests(sglang_flags.SETTINGS)
    assert sglang_flags.MANAGED_DESTS["speculative_num_steps"] == "stack.speculative.num_steps"
    without = tuple(r for r in sglang_flags.SETTINGS if r.dest != "speculative_num_steps")
    assert "speculative_num_steps" not in managed_dests(without)
    # CUDA graphs are passed only to turn them off; a pass-through of those flags stays accepted.
    assert "disable_prefill_cuda_graph" not in sglang_flags.MANAGED_DESTS


def test_sglangs_speculative_defaults_are_what_it_picks_for_ling():
    """The numbers the memory fit assumes for a NEXTN recipe that gives none are SGLang's own."""
    pytest.importorskip("sglang")
    import types

    from sglang.srt.arg_groups.speculative_hook import _auto_choose_speculative_params

    picked = _auto_choose_speculative_params(types.SimpleNamespace(speculative_algorithm="NEXTN"),
                                             sglang_flags.BAILING_ARCHITECTURE)
    assert dict(zip(SPECULATIVE_NUMBERS, picked)) == SPECULATIVE_DEFAULTS
