"""The ``plugrt`` command line.

Every :class:`PlugrtError` becomes one ``plugrt: error: ...`` message on stderr and exit
status 2; no traceback for user errors.
"""

from __future__ import annotations

import argparse
import json
import sys

from plugrt import __version__
from plugrt.errors import PlugrtError

EXIT_USER_ERROR = 2
EXIT_UNSUPPORTED = 1


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "handler"):
        parser.print_help()
        return EXIT_USER_ERROR
    try:
        return int(args.handler(args) or 0)
    except PlugrtError as exc:
        print(f"plugrt: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="plugrt", description="Build and run ONNX inference engines; every op is a plugin.")
    parser.add_argument("--version", action="version", version=f"plugrt {__version__}")
    commands = parser.add_subparsers(title="commands")

    plugins = commands.add_parser("plugins", help="list installed plugins and their ops")
    plugins.add_argument("--json", action="store_true", help="print JSON")
    plugins.set_defaults(handler=cmd_plugins)

    check = commands.add_parser("check", help="report which nodes of a model the installed plugins support")
    check.add_argument("model", help="an .onnx file")
    check.add_argument("--json", action="store_true", help="print JSON")
    check.set_defaults(handler=cmd_check)
    return parser


def cmd_plugins(args) -> int:
    from plugrt.registry import default_registry

    registry = default_registry()
    records = [r.as_json() for r in registry.plugins.values()]
    failures = [vars(f) for f in registry.failures]
    if args.json:
        print(json.dumps({"plugins": records, "failures": failures}, indent=2))
        return 0
    for record in records:
        ops = ", ".join(_op_label(op) for op in record["ops"])
        print(f"{record['name']}  ({record['distribution'] or '-'} {record['version'] or ''})".rstrip())
        print(f"    module: {record['module']}")
        if ops:
            print(f"    ops: {ops}")
        if record["passes"]:
            print(f"    passes: {', '.join(record['passes'])}")
    for failure in failures:
        print(f"FAILED {failure['name']} ({failure['distribution']} {failure['version']}): {failure['error']}")
    return 0


def _op_label(op: dict) -> str:
    prefix = f"{op['domain']}::" if op["domain"] else ""
    return prefix + op["op_type"]


def cmd_check(args) -> int:
    from plugrt.onnx.importer import support_report

    report = support_report(args.model)
    bad = [entry for entry in report if entry["status"] != "supported"]
    if args.json:
        print(json.dumps({"model": args.model, "nodes": report, "unsupported": len(bad)}, indent=2))
    else:
        for entry in report:
            mark = {"supported": "ok", "unsupported": "UNSUPPORTED", "not checked": "not checked"}[entry["status"]]
            line = f"{mark:12s} {entry['name']}  {entry['op_type']} (domain {entry['domain']}, opset {entry['opset']})"
            if entry.get("reason"):
                line += f": {entry['reason']}"
            print(line)
        print(f"{len(report) - len(bad)} of {len(report)} nodes supported")
    return EXIT_UNSUPPORTED if bad else 0


if __name__ == "__main__":
    sys.exit(main())
