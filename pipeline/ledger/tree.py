"""The entry tree of one ledger (spec section 2.2). Pure.

``parent_id`` links form a tree rooted at the header. The index keeps one small
:class:`Node` per valid entry (never the payload), so its memory grows with the number
of entries, not with the file size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from pipeline.ledger.kernel import configure_tree_c, run_c, tree_add_c
from pipeline.ledger.reader import KNOWN_KINDS, Entry
from pipeline.ledger.redact import quote
from pipeline.ledger.types import Code, Finding


@dataclass(slots=True)
class Node:
    """What the tree keeps of one valid entry.

    ``info`` is whatever the caller attached (for the audit: usage figures). Made in C
    too (:meth:`TreeIndex.adder`: the type's allocator and its slots), so its
    ``__init__`` only ever stores the fields; a test holds the two alike.
    """

    line: int
    id: str
    parent_id: str | None
    kind: str
    info: Any = None
    on_active_chain: bool = False


@dataclass(slots=True)
class TreeIndex:
    """Incrementally built tree over a ledger's valid entries, in file order."""

    nodes: list[Node] = field(default_factory=list)
    by_id: dict[str, Node] = field(default_factory=dict)
    header: Node | None = None
    _unresolved: list[Node] = field(default_factory=list)

    def add(self, entry: Entry, info: Any = None) -> Sequence[Finding]:
        """Add one valid entry; return the findings it raises on its own.

        Parameters
        ----------
        entry:
            The next valid entry in file order.
        info:
            Caller data kept on the node (never the payload itself).
        """
        ident, parent, kind = entry.id, entry.parent_id, entry.kind
        node = Node(entry.line, ident, parent, kind, info)
        by_id = self.by_id
        # The common case (a known kind whose parent came earlier, a fresh id) without
        # the checks below: this runs once per entry.
        if (kind != "header" and kind in KNOWN_KINDS and parent in by_id
                and ident not in by_id):
            by_id[ident] = node
            self.nodes.append(node)
            return ()
        findings: list[Finding] = []
        if entry.kind == "header":
            if self.header is not None:
                findings.append(Finding(
                    Code.SECOND_HEADER, entry.line, entry.id,
                    f"a header was already read on line {self.header.line}",
                ))
            else:
                if self.nodes:
                    findings.append(Finding(
                        Code.HEADER_NOT_FIRST, entry.line, entry.id,
                        f"the header follows {len(self.nodes)} other entries",
                    ))
                self.header = node
        elif entry.kind not in KNOWN_KINDS:
            findings.append(Finding(
                Code.UNKNOWN_KIND, entry.line, entry.id,
                f"kind {quote(entry.kind, 40)!r} is not known; kept in chain and tree, "
                "never projected",
            ))
        first = self.by_id.setdefault(entry.id, node)
        if first is not node:
            findings.append(Finding(
                Code.DUPLICATE_ID, entry.line, entry.id, f"id first used on line {first.line}",
            ))
        if entry.parent_id is None:
            if entry.kind != "header":
                findings.append(Finding(
                    Code.ORPHAN_PARENT, entry.line, entry.id,
                    "parent_id is null on a non-header entry",
                ))
        elif entry.parent_id == entry.id and first is node:
            # Checked before the lookup: the id was registered just above, so an entry
            # naming itself as parent would otherwise pass as a known parent, silently.
            findings.append(Finding(
                Code.ORPHAN_PARENT, entry.line, entry.id, "entry names itself as its parent",
            ))
        elif entry.parent_id not in self.by_id:
            self._unresolved.append(node)
        self.nodes.append(node)
        return findings

    def adder(self) -> Callable[..., Sequence[Finding]]:
        """:meth:`add`, for a loop over many entries, called as ``add(entry, info)``
        (positional): where the C kernel built, its common case (a known kind other
        than a header, whose parent came earlier, with a new id) is one C call that makes
        the same node (``tree_add`` in ``pipeline/ledger/_ckernel.c``), without
        :meth:`add`'s Python frame or the dataclass's ``__init__``; every other entry is
        :meth:`add`'s."""
        if tree_add_c is None:
            return self.add
        return partial(tree_add_c, self.by_id, self.nodes, self.add)

    def runner(self, info: Callable[[Entry, list[Finding]], Any], findings: list[Finding],
               last: list[Entry | None]) -> Callable[..., tuple[int, int, str]] | None:
        """The reader's ``run`` (:func:`~pipeline.ledger.reader.read_ledger`) that adds the
        common lines' entries to this tree in one C loop, each with ``info(entry,
        findings)`` as :meth:`adder` would add it, the findings of those :meth:`add`
        decides appended to ``findings``, and ``last[0]`` the last entry it took; ``None``
        where the C kernel did not build."""
        if run_c is None:
            return None
        return partial(run_c, self.by_id, self.nodes, self.add, info, findings, last)

    def finish(self) -> list[Finding]:
        """Resolve parents seen late or never, mark the active chain; return findings."""
        findings: list[Finding] = []
        for node in self._unresolved:
            parent = self.by_id.get(node.parent_id or "")
            if parent is None:
                findings.append(Finding(
                    Code.ORPHAN_PARENT, node.line, node.id,
                    "parent entry never appears in the file",
                ))
            else:
                findings.append(Finding(
                    Code.FORWARD_PARENT, node.line, node.id,
                    f"parent appears later, on line {parent.line}",
                ))
        if self.header is None:
            findings.append(Finding(Code.MISSING_HEADER, None, None, "no valid header entry"))
        # chain_to_root(head), its mark doubling as the walk's "seen": no generator, no
        # set of the nodes passed (once per entry on the active chain).
        by_id, at = self.by_id, self.head
        while at is not None and not at.on_active_chain:
            at.on_active_chain = True
            at = by_id.get(at.parent_id) if at.parent_id is not None else None
        return findings

    @property
    def head(self) -> Node | None:
        """The last valid entry (spec: the head), or ``None`` for an empty ledger."""
        return self.nodes[-1] if self.nodes else None

    def chain_to_root(self, start: Node) -> Iterator[Node]:
        """Walk parent links from ``start`` towards the root (``start`` first).

        Stops at the root, at a parent that does not exist, and at a cycle (possible
        only in tampered files), so it always terminates.
        """
        seen: set[int] = set()
        node: Node | None = start
        while node is not None and id(node) not in seen:
            seen.add(id(node))
            yield node
            node = self.by_id.get(node.parent_id) if node.parent_id is not None else None

    def active_chain(self) -> list[Node]:
        """Nodes of ``chain_to_root(head)``, root first."""
        head = self.head
        return list(self.chain_to_root(head))[::-1] if head is not None else []

    def abandoned(self) -> list[Node]:
        """Nodes off the active chain (abandoned branches), in file order.

        Valid after :meth:`finish`, which marks the active chain.
        """
        return [n for n in self.nodes if not n.on_active_chain]


if configure_tree_c is not None:
    configure_tree_c(Node, KNOWN_KINDS)
