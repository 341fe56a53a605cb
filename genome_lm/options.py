"""Every command's parameters as a pydantic model (docs/config.md): `validate` (one GenomeLMError naming
where the value came from, with a did-you-mean), `apply_override` (`--set KEY=VALUE`), `read_yaml`, and
`add_options` / `from_args` (a model's fields as flags, plus `--config FILE.yaml` and `--set`)."""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError
from pydantic_core import PydanticUndefined

from genome_lm.errors import GenomeLMError
from genome_lm.sizes import format_size

Names = Annotated[list[str], BeforeValidator(lambda v: [c.strip() for c in (v.split(",") if isinstance(v, str) else v)
                                                        if str(c).strip()])]  # 'chr1,chr2' (a flag) or a YAML list


class Params(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _known_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    keys = []
    for name, field in model.model_fields.items():
        keys.append(prefix + name)
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            keys += _known_keys(field.annotation, prefix + name + ".")
    return keys


def _initials(name: str) -> str:
    return "".join(word[0] for word in name.split("_") if word)


def _near(key: str, known: list[str]) -> str | None:
    """The known key a mistyped `key` most likely means: one of its section spelled alike or abbreviated
    ('wd' for 'weight_decay'); in an unknown section, any key spelled alike."""
    section, _, last = key.rpartition(".")
    siblings = {k.rpartition(".")[2]: k for k in known if k.rpartition(".")[0] == section}
    if section and section not in known:
        return next(iter(difflib.get_close_matches(key, known, n=1)), None)
    near = [k for k in siblings if _initials(k) == last or k == _initials(last)]
    near = near or difflib.get_close_matches(last, list(siblings), n=1)
    return siblings[near[0]] if near else None


_MESSAGES = {**dict.fromkeys(["int_parsing", "int_from_float", "int_type"], "expected an integer"),
             **dict.fromkeys(["float_parsing", "float_type"], "expected a number"),
             **dict.fromkeys(["bool_parsing", "bool_type"], "expected true or false"),
             "string_type": "expected text", "greater_than": "must be > {gt}", "greater_than_equal": "must be >= {ge}"}


def _describe(err: ValidationError, model: type[BaseModel], source: str, origin: dict[str, str],
              unknown: str) -> GenomeLMError:
    errors = err.errors()  # a mistyped key is named before the required key it leaves missing
    e = next((x for x in errors if x["type"] == "extra_forbidden"), errors[0])
    key = ".".join(str(p) for p in e["loc"])
    # a file, --set, or the flag that gave the value (origin names a whole key or its section)
    sections = (".".join(str(p) for p in e["loc"][:i]) for i in range(len(e["loc"]) - 1, 0, -1))
    src = next((origin[k] for k in (key, *sections) if k in origin),  # else a --set under an unknown section
               next((v for k, v in origin.items() if k.startswith(key + ".")), source))
    if e["type"] == "extra_forbidden":
        near = _near(key, _known_keys(model))
        hint = f"; did you mean {near}?" if near else "; remove it"
        return GenomeLMError(f"{src}: {unknown} {key}{hint}")
    if e["type"] == "missing":
        flag = _flag(key, model.model_fields.get(key))
        return GenomeLMError(f"{src}: missing required key {key}; add it" if src else f"{flag} is required")
    msg = _MESSAGES[e["type"]].format(**e.get("ctx", {})) if e["type"] in _MESSAGES else \
        e["msg"].removeprefix("Value error, ")
    got = f" (got {e['input']!r})" if "input" in e and not isinstance(e["input"], dict) else ""
    got = " (the value is empty)" if got == " (got None)" else got
    got = "" if e["type"] not in _MESSAGES and got[6:-1] in msg else got  # the message already shows the value
    if src.startswith("--") and src != "--set" and origin.get(key.split(".")[0]) == src:  # the field's own flag
        at = src
    else:  # --set key, --assume key, file: key
        at = f"{src} {key}" if src.startswith("--") else ": ".join(filter(None, [src, key]))
    return GenomeLMError(f"{at}: {msg}{got}" if at else msg)


def validate(model: type[BaseModel], raw: dict, source: str = "config", origin: dict[str, str] | None = None,
             unknown: str = "unknown key", overrides: Iterable[str] = ()):
    """`model` from `raw` with the `--set` `overrides` applied; a bad value is one GenomeLMError naming the key
    (or the flag, file or --set that `origin` says gave it; else `source`)."""
    origin = dict(origin or {})
    for assignment in overrides:  # a bad value is blamed on its --set
        origin[apply_override(raw, assignment)] = "--set"
    try:
        return model.model_validate(raw)
    except ValidationError as err:
        raise _describe(err, model, source, origin, unknown) from None


def apply_override(raw: dict, assignment: str, flag: str = "--set", example: str = "train.lr=1e-5") -> str:
    """Apply `assignment` ("a.b.c=value", a YAML value) to `raw`; return a.b.c. `example`: shown for a malformed one."""
    if "=" not in assignment:
        raise GenomeLMError(f"{flag} {assignment!r}: expected KEY=VALUE, e.g. {flag} {example}")
    key, value = assignment.split("=", 1)
    parts = [p for p in key.strip().split(".") if p]
    if not parts:
        raise GenomeLMError(f"{flag} {assignment!r}: empty key")
    node = raw
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise GenomeLMError(f"{flag} {assignment!r}: {p} is not a section")
    try:
        node[parts[-1]] = yaml.load(value, Loader=UniqueKeyLoader) if value.strip() else None
    except yaml.YAMLError as e:
        raise GenomeLMError(f"{flag} {assignment!r}: the value is not valid YAML: {_problem(e)}") from None
    return ".".join(parts)


class UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (where PyYAML keeps the last)."""

    def construct_mapping(self, node, deep=False):
        lines: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True) if key_node.tag != "tag:yaml.org,2002:merge" else None
            if isinstance(key, (str, int, float)) and key in lines:
                raise yaml.constructor.ConstructorError(None, None, f"{key} is given twice in one mapping, on lines "
                                                        f"{lines[key]} and {key_node.start_mark.line + 1}; keep one",
                                                        key_node.start_mark)
            lines[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def _problem(e: yaml.YAMLError) -> str:
    return getattr(e, "problem", None) or str(e).splitlines()[0]


def read_yaml(path: str | Path, hint: str, missing: str = "config file {} does not exist") -> dict:
    """The mapping in a YAML file; `hint` names the keys it should hold, `missing` says it does not exist."""
    path = Path(path)
    if not path.exists():
        raise GenomeLMError(missing.format(path))
    if not path.is_file():
        raise GenomeLMError(f"{path} is a folder, not a YAML file; give the file itself (keys {hint})")
    try:
        raw = yaml.load(path.read_bytes().decode("utf-8"), Loader=UniqueKeyLoader) or {}
    except UnicodeDecodeError as e:
        raise GenomeLMError(f"{path} is not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start}); save it "
                            "as UTF-8, or give the YAML file you meant") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        raise GenomeLMError(f"{path} is not valid YAML{at}: {_problem(e)}") from None
    if not isinstance(raw, dict):
        raise GenomeLMError(f"{path} must hold a mapping with keys {hint}")
    return raw


def _flag(name: str, field=None) -> str:
    return ((field and field.json_schema_extra) or {}).get("flag") or "--" + name.replace("_", "-")


def _default(v) -> str:
    if v is None or v is False or v is PydanticUndefined or v == []:
        return ""
    shown = ",".join(map(str, v)) if isinstance(v, list) else format_size(v) if type(v) is int else v
    return f" (default {shown})"


def add_options(p: argparse.ArgumentParser, model: type[BaseModel], fields: bool = True, files: bool = True) -> None:
    """One flag per field of `model` (with `fields`; every flag unset by default, so that `from_args` can
    tell given from default) and (with `files`) `--config FILE.yaml` and `--set KEY=VALUE`. A field's
    `json_schema_extra` may say `positional`, `repeat`, `flag` (another name), `metavar` or `const` (the
    value of the flag given without one)."""
    for name, f in model.model_fields.items() if fields else ():
        extra = f.json_schema_extra or {}
        assert isinstance(extra, dict), f"{name}: json_schema_extra is a dict of flag options"
        kw: dict[str, Any] = {"help": (f.description or "") + _default(f.default), "metavar": extra.get("metavar")}
        if extra.get("positional"):
            kw["nargs"] = "*" if get_origin(f.annotation) is list else None if f.is_required() else "?"
            p.add_argument(name, **kw)
            continue
        kw.update(default=None, dest=name)
        flag = _flag(name, f)
        ann = f.annotation  # X | None -> X
        ann = next((a for a in get_args(ann) if a is not type(None)), ann) if type(None) in get_args(ann) else ann
        if ann is bool:  # one plain flag: --x sets true; a field that defaults to true has --no-x instead
            kw.update(action="store_const", const=f.default is not True, help=f.description)
            flag = flag if f.default is not True else "--no-" + flag.removeprefix("--")
        elif extra.get("repeat"):
            kw["action"] = "append"
        elif "const" in extra:
            kw.update(nargs="?", const=extra["const"])
        elif get_origin(ann) is Literal:
            kw["choices"] = get_args(ann)
        p.add_argument(flag, **kw)
    if files:
        p.add_argument("--config", metavar="FILE.yaml", help="read these parameters from a YAML file "
                       "(flags and --set override it; docs/config.md)")
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="_set",
                       help=f"set a field of {model.__module__}.{model.__name__} (repeatable; wins over the flags)")
        p.set_defaults(_files_of=model)


def from_args(model: type[BaseModel], args: argparse.Namespace):
    """`model` from the --config file, then the flags given, then --set (those two only for the model
    that `add_options` gave them to)."""
    files = getattr(args, "_files_of", None) is model
    raw = read_yaml(args.config, f"{', '.join(list(model.model_fields)[:3])}, ...") if files and args.config else {}
    origin = dict.fromkeys(raw, str(getattr(args, "config", "")))
    for name, f in model.model_fields.items():
        if getattr(args, name, None) is not None:
            raw[name], origin[name] = getattr(args, name), _flag(name, f)
    return validate(model, raw, "", origin, overrides=args._set if files else ())
