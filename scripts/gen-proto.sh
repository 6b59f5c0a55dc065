#!/usr/bin/env bash
# Generate the join service's Python gRPC code from plugins/module_utils/_join/joinservice.proto.
#   scripts/gen-proto.sh          regenerate joinservice_pb2.py and joinservice_pb2_grpc.py in place
#   scripts/gen-proto.sh --check  regenerate into a temporary directory and fail (exit 1) on any drift
# The output depends only on the .proto and the grpcio-tools version (pinned in requirements-test.txt).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
package="$repo/plugins/module_utils/_join"
python="${PYTHON:-$repo/.venv/bin/python}"
[ -x "$python" ] || python=python3

check=0
case "${1:-}" in
  --check) check=1 ;;
  "") ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# Run from the package directory so the descriptor records the bare file name, wherever the repository lives.
(cd "$package" && "$python" -m grpc_tools.protoc --proto_path=. --python_out="$out" --grpc_python_out="$out" joinservice.proto)
# Deterministic post-processing, so the generated modules pass the collection's sanity tests without ignore entries:
# the sibling import made relative, third-party imports guarded (ansible-test imports module_utils without them;
# IMPORT_ERROR tells the service and the client), and a PEP 8 layout (no formatter involved: fixed rewrites only).
"$python" - "$out" <<'PY'
import ast
import io
import re
import sys
import tokenize
from pathlib import Path

out = Path(sys.argv[1])
NOTE = "# Post-processed by scripts/gen-proto.sh: relative import, guarded imports, PEP 8 layout.\n"


def guard(lines, first_import, drop=()):
    """Everything from the first import on goes under try/except ImportError/else."""
    head, body = lines[:first_import], [line for line in lines[first_import:] if line.rstrip("\n") not in drop]
    imports = []
    while body and (body[0].startswith(("import ", "from ")) or not body[0].strip()):
        if body[0].strip():
            imports.append(body[0])
        body.pop(0)
    guarded = ["try:\n"] + ["    " + line for line in imports]
    guarded += ["except ImportError as exc:  # reported by the join service and its client\n", "    IMPORT_ERROR = exc\n",
                "else:\n", "    IMPORT_ERROR = None\n"]
    guarded += [("    " + line) if line.strip() else "\n" for line in body]
    return head + [NOTE] + guarded


def collapse_blank_lines(lines, limit):
    result, blank = [], 0
    for line in lines:
        blank = blank + 1 if not line.strip() else 0
        if blank <= limit:
            result.append(line)
    while result and not result[-1].strip():
        result.pop()
    return result


def split_bytes_literal(line):
    """DESCRIPTOR = ...AddSerializedFile(b'...') over several lines of at most ~120 characters."""
    match = re.match(r"^(\s*)(DESCRIPTOR = _descriptor_pool\.Default\(\)\.AddSerializedFile\()(b'.*')\)$", line.rstrip("\n"))
    if not match:
        return [line]
    indent, call, literal = match.groups()
    data = ast.literal_eval(literal)
    chunks, start = [], 0
    while start < len(data):
        end = start + 1
        while end < len(data) and len(repr(data[start:end + 1])) <= 110:
            end += 1
        chunks.append(repr(data[start:end]))
        start = end
    return [f"{indent}{call}\n"] + [f"{indent}    {chunk}\n" for chunk in chunks] + [f"{indent})\n"]


def hanging_indents(text):
    """Continuation lines after an opening bracket that ends a line: indented by four more than the line that opened it."""
    lines = text.splitlines(keepends=True)
    brackets = {}
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.OP and token.string in "([{}])":
            ends_line = not token.line[token.end[1]:].strip() or token.line[token.end[1]:].lstrip().startswith("#")
            brackets.setdefault(token.start[0], []).append((token.string, ends_line))
    stack, result = [], []
    for number, line in enumerate(lines, start=1):
        indent = len(line) - len(line.lstrip())
        if stack and stack[-1] is not None and line.strip():
            indent = stack[-1] - (4 if line.lstrip()[0] in ")]}" else 0)
            line = " " * indent + line.lstrip()
        for bracket, ends_line in brackets.get(number, []):
            if bracket in "([{":
                stack.append(indent + 4 if ends_line else None)
            else:
                stack.pop()
        result.append(line)
    return "".join(result)


def message_module(text):
    lines = text.splitlines(keepends=True)
    fixed = []
    for line in lines:
        line = re.sub(r"^  (\S)", r"    \1", line)  # the _USE_C_DESCRIPTORS block is indented by two
        line = re.sub(r"^(\s+_globals\['\w+'\]\._serialized_(?:start|end))=(\d+)$", r"\1 = \2", line)
        fixed.extend(split_bytes_literal(line))
    fixed = collapse_blank_lines(fixed, 1)
    first = next(i for i, line in enumerate(fixed) if line.startswith("from google.protobuf"))
    return hanging_indents("".join(guard(fixed, first)))


def service_module(text):
    text = text.replace("import joinservice_pb2 as joinservice__pb2\n", "from . import joinservice_pb2 as joinservice__pb2\n")
    lines, fixed, align = text.splitlines(keepends=True), [], None
    for line in lines:
        if align is not None and line.strip():
            fixed.append(" " * align + line.lstrip())
            if line.rstrip().endswith("):"):
                align = None
            continue
        match = re.match(r"^(\s*def \w+\()request,$", line.rstrip("\n"))
        if match:
            align = len(match.group(1))
        if re.match(r"^\s+'[\w.]+', rpc_method_handlers\)$", line.rstrip("\n")):
            line = "        " + line.lstrip()
        fixed.append(line.lstrip() if line.startswith(" #") else line)
    # Below the imports everything ends up indented (guarded), where PEP 8 wants single blank lines.
    fixed = collapse_blank_lines(fixed, 1)
    first = next(i for i, line in enumerate(fixed) if line.startswith("import grpc"))
    return hanging_indents("".join(guard(fixed, first, drop=("import warnings",))))


for name, rewrite in (("joinservice_pb2.py", message_module), ("joinservice_pb2_grpc.py", service_module)):
    path = out / name
    path.write_text(rewrite(path.read_text()))
PY
grep -q '^    from \. import joinservice_pb2 as joinservice__pb2$' "$out/joinservice_pb2_grpc.py" || {
  echo "gen-proto: the generated gRPC module no longer imports joinservice_pb2 the expected way; update this script" >&2
  exit 1
}

tools=$("$python" -c 'from importlib.metadata import version; print(version("grpcio-tools"))')
if [ "$check" = 1 ]; then
  drift=0
  for name in joinservice_pb2.py joinservice_pb2_grpc.py; do
    if ! diff -u "$package/$name" "$out/$name"; then
      drift=1
    fi
  done
  if [ "$drift" = 1 ]; then
    echo "gen-proto: generated code is out of date with joinservice.proto (grpcio-tools $tools); run scripts/gen-proto.sh" >&2
    exit 1
  fi
  echo "gen-proto: generated code is up to date (grpcio-tools $tools)"
else
  install -m 0644 "$out/joinservice_pb2.py" "$out/joinservice_pb2_grpc.py" "$package/"
  echo "gen-proto: wrote joinservice_pb2.py and joinservice_pb2_grpc.py (grpcio-tools $tools)"
fi
