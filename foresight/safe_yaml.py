"""The one YAML reader: PyYAML's safe loader, a key given twice refused, the text and its alias expansion bounded.

PyYAML's ``safe_load`` keeps the last value of a key given twice without a word, and builds nine nested aliases of
nine items each (a few hundred bytes) into 9^9 values that anything walking them (a config check, an error message)
never finishes. :func:`load_yaml` refuses both, and a text over :data:`MAX_YAML_BYTES`, before anything is
constructed; every refusal is a :class:`yaml.YAMLError` whose ``problem`` (and ``problem_mark``, where it has a
line) :func:`foresight.config.read_yaml_mapping` turns into one line naming the file.
"""

from __future__ import annotations

import yaml

#: The largest YAML text read (configs are a few kilobytes).
MAX_YAML_BYTES = 1 << 20
#: The most values a YAML document may hold once its aliases are expanded (configs hold a few hundred).
MAX_YAML_NODES = 100_000


class YAMLLimitError(yaml.YAMLError):
    """A YAML text past one of this module's bounds."""

    def __init__(self, problem: str):
        super().__init__(problem)
        self.problem, self.problem_mark = problem, None


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a mapping key given twice (a merge key's values may still be overridden)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node.start_mark)
                except TypeError:  # an unhashable key: the base class refuses it
                    continue
                if first is not key_node.start_mark:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} given twice, first on line {first.line + 1}", key_node.start_mark)
        return super().construct_mapping(node, deep)


def _check_expansion(node) -> None:
    """Refuse a document holding more than :data:`MAX_YAML_NODES` values once every alias is expanded (each shared
    node counted once per use, in time linear in the document), or an alias inside the value it names."""
    sizes: dict[int, int] = {}

    def size(n, path: frozenset) -> int:
        if id(n) in path:
            raise YAMLLimitError("an alias refers to a value that contains it, a recursive value; write it out")
        if id(n) not in sizes:
            children = ([c for pair in n.value for c in pair] if isinstance(n, yaml.MappingNode) else
                        list(n.value) if isinstance(n, yaml.SequenceNode) else [])
            sizes[id(n)] = 1 + sum(size(c, path | {id(n)}) for c in children)
            if sizes[id(n)] > MAX_YAML_NODES:
                raise YAMLLimitError(f"it expands to more than {MAX_YAML_NODES:,} values through its aliases, &anchor "
                                     "and *alias; write the values out")
        return sizes[id(n)]

    size(node, frozenset())


def load_yaml(text: str):
    """The value of one YAML document (safe tags only; None for an empty one); :class:`yaml.YAMLError` for a syntax
    error, a key given twice, a text over :data:`MAX_YAML_BYTES` or aliases expanding past :data:`MAX_YAML_NODES`."""
    if len(text) > MAX_YAML_BYTES:
        raise YAMLLimitError(f"{len(text):,} characters, more than the {MAX_YAML_BYTES:,} a config may hold")
    loader = _StrictLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expansion(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


__all__ = ["MAX_YAML_BYTES", "MAX_YAML_NODES", "YAMLLimitError", "load_yaml"]
