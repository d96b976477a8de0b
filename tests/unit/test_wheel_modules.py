"""The wheel holds no test machinery: every module under `service/` is reached from the
service itself or from the library face `tickgate` (an entry point, or a module of the
wheel that imports it), never only from tests, the harness or the benchmarks. Fakes and
fault injection live in `harness/`.
"""

import grimp

# Where the service starts: the console script, and the modules a process runs by name
# (`python -m service`, `python -m service.client`, the server a supervisor forks).
ENTRY_POINTS = {"service.cli", "service.server"}


def test_no_module_of_the_service_is_imported_only_by_tests() -> None:
    graph = grimp.build_graph("service", "tickgate", "harness", "tests", "bench")
    modules = {m for m in graph.modules if m == "service" or m.startswith("service.")}
    packages = {m.rpartition(".")[0] for m in modules}
    unreached = sorted(
        module
        for module in modules - ENTRY_POINTS - packages - {"service"}
        if not module.endswith(".__main__")
        and not any(
            importer.startswith(("service", "tickgate"))
            for importer in graph.find_modules_that_directly_import(module)
        )
    )
    assert unreached == [], f"imported only from outside the service: {unreached}"
