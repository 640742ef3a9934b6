"""Unit tests of pipeline.ledger.tree: spec 2.2 tree findings, chains, branches, cycles."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.ledger import kernel
from pipeline.ledger.reader import Entry
from pipeline.ledger.tree import Node, TreeIndex
from pipeline.ledger.types import Code, Finding, Severity
from tests.helpers.ledgers import LedgerBuilder, audit_bytes, codes, make_id, read_bytes


def build_tree(b: LedgerBuilder) -> tuple[TreeIndex, list[Finding]]:
    """Feed a builder's valid entries to a tree; return it and its findings only."""
    entries, _ = read_bytes(b.to_bytes())
    tree = TreeIndex()
    findings: list[Finding] = []
    for e in entries:
        findings.extend(tree.add(e))
    findings.extend(tree.finish())
    return tree, findings


def ids(nodes: list[Node]) -> list[str]:
    return [n.id for n in nodes]


def test_linear_ledger_is_one_chain() -> None:
    b = LedgerBuilder()
    made = [b.header(), b.user("a"), b.assistant("b"), b.user("c")]
    tree, findings = build_tree(b)
    assert findings == []
    assert tree.header is not None and tree.header.line == 1
    assert tree.head is not None and tree.head.id == made[-1]
    assert ids(tree.active_chain()) == made
    assert tree.abandoned() == []


def test_missing_header_has_no_line() -> None:
    b = LedgerBuilder()
    b.user("a", parent=None)
    b.assistant("b")
    tree, findings = build_tree(b)
    missing = [f for f in findings if f.code is Code.MISSING_HEADER]
    assert len(missing) == 1 and missing[0].line is None
    assert missing[0].severity is Severity.ERROR
    assert tree.header is None
    # The file is still read: the entries form their tree.
    assert len(tree.active_chain()) == 2


def test_missing_header_in_the_audit_row() -> None:
    b = LedgerBuilder()
    b.user("a", parent=None)
    audit = audit_bytes(b.to_bytes())
    assert (None, "missing_header") in codes(audit.findings)
    assert audit.findings[0].code is Code.MISSING_HEADER  # line-less findings sort first
    assert audit.row["status"] == "error"
    assert audit.row["session_id"] is None


def test_header_not_first() -> None:
    b = LedgerBuilder()
    first = b.activity("early", parent=None)
    b.header()
    b.user("a", parent=first)
    tree, findings = build_tree(b)
    assert codes(findings) == {(1, "orphan_parent"), (2, "header_not_first")}
    assert tree.header is not None and tree.header.line == 2


def test_second_header() -> None:
    b = LedgerBuilder()
    b.header()
    b.user("a")
    b.header()
    b.user("b")
    tree, findings = build_tree(b)
    assert codes(findings) == {(3, "second_header")}
    assert tree.header is not None and tree.header.line == 1


def test_orphan_parent_never_seen() -> None:
    b = LedgerBuilder()
    b.header()
    b.user("a", parent=make_id(999))
    _, findings = build_tree(b)
    assert codes(findings) == {(2, "orphan_parent")}


def test_orphan_parent_null_on_a_non_header() -> None:
    b = LedgerBuilder()
    b.header()
    b.user("a", parent=None)
    _, findings = build_tree(b)
    assert codes(findings) == {(2, "orphan_parent")}


def test_self_parent_is_reported() -> None:
    b = LedgerBuilder()
    b.header()
    b.user("a", parent=make_id(2), ident=make_id(2))
    tree, findings = build_tree(b)
    assert codes(findings) == {(2, "orphan_parent")}
    assert ids(tree.active_chain()) == [make_id(2)]


def test_forward_parent() -> None:
    b = LedgerBuilder()
    h = b.header()
    b.user("a", parent=make_id(3), ident=make_id(2))
    b.assistant("b", parent=h, ident=make_id(3))
    _, findings = build_tree(b)
    assert codes(findings) == {(2, "forward_parent")}
    assert [f.severity for f in findings] == [Severity.ERROR]


def test_duplicate_id() -> None:
    b = LedgerBuilder()
    h = b.header()
    u = b.user("a")
    b.assistant("b", ident=u)
    tree, findings = build_tree(b)
    assert codes(findings) == {(3, "duplicate_id")}
    # The first use of the id keeps it; the duplicate is still a node of the tree.
    assert tree.by_id[u].line == 2
    assert len(tree.nodes) == 3
    assert [n.line for n in tree.active_chain()] == [1, 2, 3]
    assert tree.active_chain()[0].id == h


def test_unknown_kind_is_info_and_kept() -> None:
    b = LedgerBuilder()
    b.header()
    k = b.entry("hologram", {"x": 1})
    last = b.user("a")
    tree, findings = build_tree(b)
    assert codes(findings) == {(2, "unknown_kind")}
    assert findings[0].severity is Severity.INFO
    assert ids(tree.active_chain())[1:] == [k, last]


def test_later_kinds_are_known() -> None:
    b = LedgerBuilder()
    b.header()
    for kind in ("evidence_body", "context_selection", "turn_capabilities_ref", "call_effect",
                 "turn_card", "presentation", "compaction", "goal", "goal_update", "intent",
                 "child_run", "turn_capabilities_bound"):
        b.entry(kind, {})
    b.work()
    _, findings = build_tree(b)
    assert findings == []


def branched() -> tuple[LedgerBuilder, dict[str, str]]:
    """header, u1, a1, u2, a2 | branch at a1: u3, a3 | branch at h: u4, a4 | at a3: u5."""
    b = LedgerBuilder()
    n: dict[str, str] = {}
    n["h"] = b.header()
    n["u1"] = b.user("one")
    n["a1"] = b.assistant("one")
    n["u2"] = b.user("two")
    n["a2"] = b.assistant("two")
    b.branch_at(n["a1"])
    n["u3"] = b.user("three")
    n["a3"] = b.assistant("three")
    b.branch_at(n["h"])
    n["u4"] = b.user("four")
    n["a4"] = b.assistant("four")
    b.branch_at(n["a3"])
    n["u5"] = b.user("five")
    return b, n


def test_chain_to_root_walks_parents_head_first() -> None:
    b, n = branched()
    tree, findings = build_tree(b)
    assert findings == []
    assert ids(list(tree.chain_to_root(tree.by_id[n["a4"]]))) == [n["a4"], n["u4"], n["h"]]
    assert ids(list(tree.chain_to_root(tree.by_id[n["h"]]))) == [n["h"]]


def test_active_chain_and_abandoned_branches() -> None:
    b, n = branched()
    tree, _ = build_tree(b)
    assert tree.head is not None and tree.head.id == n["u5"]  # the last valid entry
    assert ids(tree.active_chain()) == [n[k] for k in ("h", "u1", "a1", "u3", "a3", "u5")]
    assert ids(tree.abandoned()) == [n[k] for k in ("u2", "a2", "u4", "a4")]
    assert all(node.on_active_chain for node in tree.active_chain())
    assert not any(node.on_active_chain for node in tree.abandoned())


def test_branched_session_row() -> None:
    b, _ = branched()
    audit = audit_bytes(b.to_bytes())
    assert audit.findings == []
    assert audit.row["active_chain_len"] == 6
    assert audit.row["abandoned_entries"] == 4
    assert audit.row["turns"] == 3  # u1, u3, u5 on the active chain
    assert audit.row["requests"] == 2 and audit.row["requests_abandoned"] == 2


def test_head_is_the_last_valid_entry_not_the_last_line() -> None:
    b, n = branched()
    b.raw(b"{torn", newline=False)
    tree, _ = build_tree(b)
    assert tree.head is not None and tree.head.id == n["u5"]


def test_tampered_parent_cycle_terminates() -> None:
    """a -> b -> c -> a: walking parents stops after each node once."""
    b = LedgerBuilder()
    b.header()
    a, bb, c = make_id(10), make_id(11), make_id(12)
    b.user("a", ident=a, parent=c)
    b.assistant("b", ident=bb, parent=a)
    b.user("c", ident=c, parent=bb)
    tree, findings = build_tree(b)
    assert (2, "forward_parent") in codes(findings)
    walk = ids(list(tree.chain_to_root(tree.by_id[c])))
    assert walk == [c, bb, a]
    assert sorted(ids(tree.active_chain())) == sorted([a, bb, c])
    assert ids(tree.abandoned()) == [tree.nodes[0].id]  # the header is off the cycle


def test_two_node_cycle_through_duplicate_ids_terminates() -> None:
    b = LedgerBuilder()
    x = make_id(50)
    b.header()
    b.user("x", ident=x, parent=make_id(51))
    b.assistant("y", ident=make_id(51), parent=x)
    b.assistant("z", ident=x, parent=make_id(51))
    tree, findings = build_tree(b)
    assert (4, "duplicate_id") in codes(findings)
    assert len(list(tree.chain_to_root(tree.nodes[-1]))) == 3


IDS = st.sampled_from(["a", "b", "c", "d", "e"])


@given(st.lists(st.tuples(IDS, st.none() | IDS, st.sampled_from(["header", "message", "x"])),
                min_size=1, max_size=12))
def test_the_active_chain_is_the_walk_from_the_head(
        links: list[tuple[str, str | None, str]]) -> None:
    # Any links: repeated ids, self-parents, forward parents, cycles.
    tree = TreeIndex()
    for line, (ident, parent, kind) in enumerate(links, 1):
        tree.add(Entry(line, ident, parent, kind, "", None, None, "", {}))
    tree.finish()
    assert tree.head is not None
    walk = {id(n) for n in tree.chain_to_root(tree.head)}
    assert {id(n) for n in tree.nodes if n.on_active_chain} == walk


def tree_of(links: list[tuple[str, str | None, str]], fast: bool) -> TreeIndex:
    tree = TreeIndex()
    add = tree.adder() if fast else tree.add
    for line, (ident, parent, kind) in enumerate(links, 1):
        found = add(Entry(line, ident, parent, kind, "", None, None, "", {}), {"n": line})
        assert isinstance(found, (tuple, list))
    return tree


def state(tree: TreeIndex) -> tuple[object, ...]:
    return (tree.nodes, tree.by_id, tree.header, tree._unresolved, tree.finish(),
            [n.on_active_chain for n in tree.nodes])


@pytest.mark.skipif(kernel.tree_add_c is None, reason="the C kernel did not build here")
@given(st.lists(st.tuples(IDS, st.none() | IDS,
                          st.sampled_from(["header", "message", "receipt", "x", ""])),
                min_size=1, max_size=12))
def test_the_c_adder_builds_the_tree_add_builds(
        links: list[tuple[str, str | None, str]]) -> None:
    # Its common case in C, every other entry through add: the same nodes (each a Node
    # equal field by field), index, header, findings and active chain.
    fast, slow = tree_of(links, fast=True), tree_of(links, fast=False)
    assert all(type(n) is Node for n in fast.nodes)
    assert state(fast) == state(slow)


@pytest.mark.skipif(kernel.tree_add_c is None, reason="the C kernel did not build here")
def test_the_c_adder_takes_only_the_common_case() -> None:
    tree = TreeIndex()
    add = tree.adder()
    header = Entry(1, "h", None, "header", "", None, None, "", {})
    assert add(header) == [] and tree.header is not None  # add's own path
    info = object()
    assert add(Entry(2, "a", "h", "message", "", None, None, "", {}), info) == ()
    made = tree.by_id["a"]
    assert made == Node(2, "a", "h", "message", info) and made.info is info
    assert tree.nodes == [tree.header, made]
    assert [f.code.text for f in add(Entry(3, "a", "h", "message", "", None, None, "", {}))] \
        == ["duplicate_id"]
    assert [f.code.text for f in add(Entry(4, "b", "h", "nope", "", None, None, "", {}))] \
        == ["unknown_kind"]


def test_long_chain_is_walked_without_recursion() -> None:
    b = LedgerBuilder()
    b.header()
    for i in range(5000):
        b.activity(f"a{i}")
    tree, findings = build_tree(b)
    assert findings == []
    assert len(tree.active_chain()) == 5001


def test_nodes_do_not_keep_payloads() -> None:
    b = LedgerBuilder()
    b.header()
    b.user("x" * 10_000)
    tree, _ = build_tree(b)
    for node in tree.nodes:
        assert not isinstance(node.info, Entry)
        assert not hasattr(node, "data")
