"""A pflag-like command-line parser shared by the doubles."""

from __future__ import annotations

from dataclasses import dataclass, field

from .common import DoubleError


class UsageError(DoubleError):
    """Bad command line; the tools print it and exit 1."""


@dataclass
class Parsed:
    flags: dict[str, object] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)
    given: set[str] = field(default_factory=set)

    def get(self, name: str, default: object = None) -> object:
        return self.flags.get(name, default)


def parse(
    argv: list[str],
    spec: dict[str, str],
    shorts: dict[str, str] | None = None,
    defaults: dict[str, object] | None = None,
) -> Parsed:
    """Parse argv: spec maps flag -> "bool" | "str" | "list" (comma separated, repeatable) | "array"."""
    shorts = shorts or {}
    result = Parsed(flags=dict(defaults or {}))
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg == "--":
            result.args.extend(args)
            break
        if arg.startswith("--"):
            name, has_value, value = arg[2:].partition("=")
        elif arg.startswith("-") and len(arg) > 1:
            short = arg[1]
            if short not in shorts:
                raise UsageError(f"unknown shorthand flag: '{short}' in {arg}")
            name = shorts[short]
            rest = arg[2:]
            has_value, value = bool(rest), rest.lstrip("=")
        else:
            result.args.append(arg)
            continue
        if name not in spec:
            raise UsageError(f"unknown flag: --{name}")
        kind = spec[name]
        if kind == "bool":
            if has_value and value not in ("true", "false", "1", "0", "True", "False"):
                raise UsageError(
                    f'invalid argument "{value}" for "--{name}" flag: strconv.ParseBool: parsing "{value}": invalid syntax'
                )
            result.flags[name] = (value in ("true", "1", "True")) if has_value else True
        else:
            if not has_value:
                if not args:
                    raise UsageError(f"flag needs an argument: --{name}")
                value = args.pop(0)
            if kind == "list":
                previous = result.flags.get(name) if name in result.given else []
                result.flags[name] = list(previous) + [v for v in value.split(",") if v]  # type: ignore[arg-type]
            elif kind == "array":
                previous = result.flags.get(name) if name in result.given else []
                result.flags[name] = list(previous) + [value]  # type: ignore[arg-type]
            else:
                result.flags[name] = value
        result.given.add(name)
    return result
