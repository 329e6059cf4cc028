"""Reading YAML while remembering the file and line of every object and field."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpufleet.model.problems import Problem

FieldPath = tuple[str | int, ...]
YAML_SUFFIXES = (".yaml", ".yml")


@dataclass(frozen=True)
class Source:
    """Where an object came from: its file, the line it starts on and the line of each field."""

    file: str
    line: int
    field_lines: Mapping[FieldPath, int] = field(default_factory=dict)

    def line_of(self, path: Sequence[str | int]) -> int:
        """Line of the field at `path`, or of its closest ancestor that exists in the file."""
        key = tuple(path)
        while key:
            if key in self.field_lines:
                return self.field_lines[key]
            key = key[:-1]
        return self.line


@dataclass(frozen=True)
class Document:
    """One YAML document, as plain Python data, with its source."""

    data: Any
    source: Source


class _DuplicateKey(Exception):
    def __init__(self, key: object, line: int, first_line: int) -> None:
        super().__init__(key)
        self.key = key
        self.line = line
        self.first_line = first_line


def _to_python(
    node: yaml.Node, loader: yaml.SafeLoader, path: FieldPath, lines: dict[FieldPath, int]
) -> Any:
    if isinstance(node, yaml.MappingNode):
        loader.flatten_mapping(node)  # resolves `<<:` merge keys
        result: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in result:
                raise _DuplicateKey(key, line, lines[(*path, key)])
            lines[(*path, key)] = line
            result[key] = _to_python(value_node, loader, (*path, key), lines)
        return result
    if isinstance(node, yaml.SequenceNode):
        items = []
        for index, item_node in enumerate(node.value):
            lines[(*path, index)] = item_node.start_mark.line + 1
            items.append(_to_python(item_node, loader, (*path, index), lines))
        return items
    return loader.construct_object(node, deep=True)


def parse_yaml(text: str, file: str) -> tuple[list[Document], list[Problem]]:
    """Parse a multi-document YAML text; syntax errors and duplicate keys become problems."""
    documents: list[Document] = []
    loader = yaml.SafeLoader(text)
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            lines: dict[FieldPath, int] = {}
            try:
                data = _to_python(node, loader, (), lines)
            except _DuplicateKey as dup:
                message = (
                    f"duplicate key {dup.key!r} (first set on line {dup.first_line}); "
                    "YAML keeps only the last value, so remove one of them"
                )
                return documents, [Problem(file, dup.line, "error", message, "DuplicateKey")]
            if data is None:
                continue
            documents.append(Document(data, Source(file, node.start_mark.line + 1, lines)))
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        line = mark.line + 1 if mark else 1
        reason = err.problem or err.context or "invalid YAML"
        return documents, [Problem(file, line, "error", f"invalid YAML: {reason}", "YAMLSyntax")]
    except yaml.YAMLError as err:
        return documents, [Problem(file, 1, "error", f"invalid YAML: {err}", "YAMLSyntax")]
    finally:
        loader.dispose()
    return documents, []


def iter_yaml_files(paths: Sequence[str | Path]) -> Iterator[Path | Problem]:
    """Expand files and directories (recursively, sorted) into YAML files; missing paths are
    reported as problems so that one typo does not hide the rest of the run."""
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in YAML_SUFFIXES)
            if not found:
                yield Problem(str(path), 0, "warning", "no *.yaml or *.yml files in directory")
            yield from found
        elif path.is_file():
            yield path
        else:
            yield Problem(
                str(path), 0, "error", "no such file or directory; pass a YAML file or a folder"
            )


def read_documents(paths: Sequence[str | Path]) -> tuple[list[Document], list[Problem]]:
    documents: list[Document] = []
    problems: list[Problem] = []
    for item in iter_yaml_files(paths):
        if isinstance(item, Problem):
            problems.append(item)
            continue
        try:
            text = item.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            problems.append(Problem(str(item), 0, "error", f"cannot read file: {err}", "IO"))
            continue
        docs, errs = parse_yaml(text, str(item))
        documents.extend(docs)
        problems.extend(errs)
    return documents, problems
