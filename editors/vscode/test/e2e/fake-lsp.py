#!/usr/bin/env python3
"""A stand-in for `completiond-lsp` that checks the e2e harness and the extension's side of the
contract without a model: stdio JSON-RPC, no dependencies.

It speaks the same contract as the real server: inlineCompletionProvider (textDocument/
inlineCompletion), incremental sync, executeCommandProvider `completiond.rewrite`, the
`completiond/status` notification, initializationOptions and workspace/didChangeConfiguration.
Completions are canned: after "ma" it offers "in()", after "pri" `nt("done")`, otherwise
" # completiond". Every received message is appended to $FAKE_LSP_LOG (JSON lines) if set.

    COMPLETIOND_LSP=$PWD/test/e2e/fake-lsp.py bash test/e2e.sh
"""
import json
import os
import sys
import time

LOG = os.environ.get("FAKE_LSP_LOG")
docs: dict[str, list[str]] = {}
settings: dict = {}
served = 0


def record(msg: dict) -> None:
    if LOG:
        with open(LOG, "a", encoding="utf-8") as f:
            f.write(json.dumps(msg) + "\n")


def send(msg: dict) -> None:
    body = json.dumps({"jsonrpc": "2.0", **msg}).encode()
    sys.stdout.buffer.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
    sys.stdout.buffer.flush()


def read() -> dict | None:
    length = 0
    while True:
        line = sys.stdin.buffer.readline()
        if not line:
            return None
        line = line.strip()
        if not line:
            break
        name, _, value = line.decode().partition(":")
        if name.lower() == "content-length":
            length = int(value)
    return json.loads(sys.stdin.buffer.read(length))


def status(state: str, latency: float | None = None) -> None:
    send({"method": "completiond/status", "params": {
        "state": state, "message": "fake server" if state == "ready" else "loading fake model",
        "target": "fake/target-model", "draft": None, "device": "cpu",
        "lastLatencyMs": latency, "meanAccepted": 2.5 if latency is not None else None}})


def offset(lines: list[str], pos: dict) -> int:
    return sum(len(l) + 1 for l in lines[: pos["line"]]) + pos["character"]


def apply_change(uri: str, change: dict) -> None:
    text = "\n".join(docs[uri])
    if "range" in change:
        a, b = offset(docs[uri], change["range"]["start"]), offset(docs[uri], change["range"]["end"])
        text = text[:a] + change["text"] + text[b:]
    else:
        text = change["text"]
    docs[uri] = text.split("\n")


def complete(prefix: str) -> str:
    if prefix.endswith("ma"):
        return "in()"
    if prefix.endswith("pri"):
        return 'nt("done")'
    return " # completiond"


def handle(msg: dict) -> bool:
    global served
    method, params, mid = msg.get("method"), msg.get("params") or {}, msg.get("id")
    if method == "initialize":
        settings.update(params.get("initializationOptions") or {})
        send({"id": mid, "result": {
            "capabilities": {
                "textDocumentSync": {"openClose": True, "change": 2},
                "inlineCompletionProvider": True,
                "executeCommandProvider": {"commands": ["completiond.rewrite"]},
                "codeActionProvider": True,
            },
            "serverInfo": {"name": "fake-completiond-lsp", "version": "0"}}})
    elif method == "initialized":
        status("loading")
        time.sleep(0.3)
        status("ready")
    elif method == "textDocument/didOpen":
        docs[params["textDocument"]["uri"]] = params["textDocument"]["text"].split("\n")
    elif method == "textDocument/didChange":
        for change in params["contentChanges"]:
            apply_change(params["textDocument"]["uri"], change)
    elif method == "textDocument/didClose":
        docs.pop(params["textDocument"]["uri"], None)
    elif method == "workspace/didChangeConfiguration":
        settings.update((params.get("settings") or {}).get("completiond") or {})
    elif method == "textDocument/inlineCompletion":
        t0 = time.perf_counter()
        pos = params["position"]
        line = docs.get(params["textDocument"]["uri"], [""])[pos["line"]]
        text = complete(line[: pos["character"]])
        send({"id": mid, "result": {"items": [{"insertText": text, "range": {"start": pos, "end": pos}}]}})
        served += 1
        status("ready", (time.perf_counter() - t0) * 1000 + 40)
    elif method == "textDocument/codeAction":
        send({"id": mid, "result": []})
    elif method == "workspace/executeCommand":
        arg = (params.get("arguments") or [{}])[0]
        new = f"# rewritten: {arg.get('instruction', '')}"
        send({"id": 9000 + served, "method": "workspace/applyEdit", "params": {"edit": {"changes": {
            arg["uri"]: [{"range": arg["range"], "newText": new}]}}}})
        send({"id": mid, "result": {"applied": True, "text": new}})
    elif method == "shutdown":
        send({"id": mid, "result": None})
    elif method == "exit":
        return False
    elif mid is not None and method is not None:
        send({"id": mid, "error": {"code": -32601, "message": f"method not found: {method}"}})
    return True


def main() -> None:
    while (msg := read()) is not None:
        record(msg)
        if not handle(msg):
            break


if __name__ == "__main__":
    if sys.argv[1:]:  # like the real server: no --stdio or other stray flags
        sys.exit(f"fake-lsp: unrecognized arguments: {' '.join(sys.argv[1:])}")
    main()
