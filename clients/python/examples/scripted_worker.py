"""A worker whose runs follow a small script in the prompt, one directive
per line (like the server's `simulated` runner), for demos and end-to-end
tests:

    output <text>     append a line to the result (streamed as output)
    tool <name>       report a tool call
    usage <in> <out>  report token usage
    approve <tool>    ask for approval; appends "approved: <tool>" or
                      "denied: <tool>[: <note>]"
    wait_steer        wait for a steer message; appends "steer: <message>"
    hang              wait until the server stops the run
    fail <message>    fail the run with code RUN_FAILED
    fail_on <model> <status>
                      on that model, fail with code PROVIDER_<status>,
                      retryable (fallback_models) for 429, 5xx, 401, 403
                      and 404
    turn              report the start of a turn (max_turns)
    session <id>      return <id> as this run's session (the run that
                      continues the agent gets it back)
    history           append "previous session: <id or none>", then one
                      line per transcript entry of a continuation's
                      history: "turn <n> <kind>: <text>"
    anything else     appended as is

Usage: python scripted_worker.py --addr 127.0.0.1:50051 --agents coder --capacity 2
Prints "ready <worker_id>" once connected.
"""

import argparse
import logging
import sys

from subagentd.worker import Run, RunFailed, Worker


def handle(run: Run) -> str:
    lines: list[str] = []

    def emit(text: str) -> None:
        run.output(text if not lines else "\n" + text)
        lines.append(text)

    for line in run.prompt.splitlines():
        word, _, rest = line.strip().partition(" ")
        rest = rest.strip()
        if word == "output":
            emit(rest)
        elif word == "turn" and not rest:
            run.turn_started()
        elif word == "session" and rest:
            run.session = rest
        elif word == "history":
            emit(f"previous session: {run.previous_session or 'none'}")
            for entry in run.history:
                kind = entry.kind.name.lower()
                text = entry.text.replace("\n", "\\n")
                emit(f"turn {entry.turn} {kind}: {text}")
        elif word == "tool" and rest:
            run.tool_call(rest)
        elif word == "usage" and len(rest.split()) == 2:
            i, o = (int(x) for x in rest.split())
            run.usage(input_tokens=i, output_tokens=o)
        elif word == "approve" and rest:
            outcome = run.request_approval(rest)
            if outcome.approved:
                emit(f"approved: {rest}")
            else:
                emit(f"denied: {rest}" + (f": {outcome.note}" if outcome.note else ""))
        elif word == "wait_steer":
            emit(f"steer: {run.next_steer()}")
        elif word == "hang":
            run.wait_cancelled()
        elif word == "fail_on" and len(rest.split()) == 2:
            model, status = rest.split()
            if run.agent_view.model == model:
                code = int(status)
                retryable = code in (401, 403, 404, 429) or code >= 500
                raise RunFailed(f"PROVIDER_{code}", f"provider error {code} on {model}", retryable=retryable)
        elif word == "fail":
            raise RunFailed("RUN_FAILED", rest)
        else:
            emit(line)
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--addr", default="127.0.0.1:50051")
    p.add_argument("--agents", default="coder", help="comma-separated agent types")
    p.add_argument("--capacity", type=int, default=1)
    p.add_argument("--name", default="scripted-worker")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    worker = Worker(args.addr, agents=args.agents.split(","), capacity=args.capacity, name=args.name, handler=handle)

    import threading

    def announce() -> None:
        worker.ready.wait()
        print(f"ready {worker.worker_id}", flush=True)

    threading.Thread(target=announce, daemon=True).start()
    worker.run()


if __name__ == "__main__":
    main()
