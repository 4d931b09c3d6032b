"""torch.export of a module whose forward appends through nvfp4kv: the append is one node of the graph,
its cache mutation is kept (in the training IR as the in-place op itself, after run_decompositions as
a functionalized op whose results the graph signature writes back into the cache inputs), and running
the exported program writes the eager bytes. The AOTInductor package of the same module is run from
C++ by tests/cpp (ctest)."""

import pytest
import torch

from deployment_modules import CACHE_INPUTS, cloned, make_inputs

APPEND = torch.ops.nvfp4kv.append_paged_kv_cache.default
CACHE_NAMES = ["k_cache", "v_cache", "k_cache_sf", "v_cache_sf"]


def append_nodes(graph):
    """Nodes that run the append: the op itself, or a functionalization wrapper around it."""
    nodes = []
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is APPEND or (node.args and node.args[0] is APPEND):
            nodes.append(node)
    return nodes


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_export_keeps_one_mutating_append(layout):
    module, inputs = make_inputs(layout, seed=31)
    program = torch.export.export(module, tuple(cloned(inputs)))
    (node,) = append_nodes(program.graph)
    assert node.target is APPEND
    # The mutated arguments are exactly the four caches, as the schema's (a!) annotations say.
    written = [a.name for a in APPEND._schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    assert written == CACHE_NAMES
    assert [node.args[i].name for i in CACHE_INPUTS] == CACHE_NAMES

    eager = cloned(inputs)
    expected = module(*eager)
    exported = cloned(inputs)
    output = program.module()(*exported)
    for i in CACHE_INPUTS:
        assert same_bytes(exported[i], eager[i]), CACHE_NAMES[CACHE_INPUTS.index(i)]
    assert torch.equal(output.view(torch.int32), expected.view(torch.int32))


def test_decomposed_program_writes_the_mutation_back():
    module, inputs = make_inputs("NHD", seed=32)
    program = torch.export.export(module, tuple(cloned(inputs))).run_decompositions()
    (node,) = append_nodes(program.graph)  # still one node: the functionalized append
    mutated = program.graph_signature.user_inputs_to_mutate
    assert sorted(mutated.values()) == sorted(CACHE_NAMES)

    eager = cloned(inputs)
    module(*eager)
    exported = cloned(inputs)
    program.module()(*exported)
    for i in CACHE_INPUTS:
        assert same_bytes(exported[i], eager[i])
