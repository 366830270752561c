"""vulture whitelist: names that look unused to vulture but are used from outside its view.

Regenerate candidates with
``vulture core plugins vulture_whitelist.py --min-confidence 60 --ignore-decorators ...``
(see tox.ini, env ``lint``); add a name here only with the reason it is alive.
Hook implementations (``@hookimpl``) and specs (``@hookspec``) are ignored by decorator.
"""

# ruff: noqa
# fmt: off
# PEP 562 / data model / context-manager protocol, called by Python itself
__dir__; __call__; exc_type; exc; tb; protocol
# sub-command registration found by name (cli.commands.EXTRA_COMMANDS / EXTRA_CONFIG_COMMANDS)
add_bench_parser; add_import_accelerate_parser; add_precompile_parser
# framework callbacks: Lightning, transformers Trainer
_.on_fit_start; _.on_validation_start; _.on_test_start; _.on_predict_start; trainer
_.on_train_begin; control
# public API and fields read by users, reports or JSON (attrs fields, reprlib limits)
_.to_kwargs; _.to_torchkiln; ENV_NAMES; preset; format; extras
# a GroupPreparation field plugins set; the compiler reads it by name (region_compiler._wrapped)
_.wrap_traced
_.maxlevel; _.maxdict; _.maxlist; _.maxtuple; _.maxset; _.maxstring; _.maxother; _.maxlong
_.hits; _.misses; _.load_seconds; max_abs_diff; gradients_checked
# read by transformers (its output collector) and by the bench table / a queue protocol
_.global_var; _.end
# report fields read by users and to_dict(); the manager's dispatch found by hook name
# (plugin_faults.call_hook); an attrs validator
recompile_reasons; _.wrap_distributed; _compiles; recompile_limit_hit; later_recompiles
# KernelTemplate._template_from_string: torch reads the attribute it is set on (core/artifacts/deferred_templates.py)
_._template_from_string
# pickle.Pickler calls reducer_override for every object (core/tiered/weightless.py)
_.reducer_override
# called by transformers' decoder layers on the cache views handed to compiled blocks
# (plugins/transformers_nested.py's NestedLayerCache)
_.get_seq_length
# the release fact the built-in trap tests and docs/guide.md check against a graph count
# (core/_internals/versions.py)
module_compile_skips_torch_nn
