"""The worker library against a scripted WorkerService (no subagentd): a run
the handler finished stays held until the server releases it. A session that
ends before `released` (a server that crashed before the run's end was
durable) is followed by one whose hello names the run and which gets every
report of the run again, with the same numbers; once released, the run is
forgotten."""

import queue
import threading
import unittest
from concurrent import futures

import grpc

from subagents.v1 import subagents_pb2 as pb
from subagents.v1 import workers_pb2, workers_pb2_grpc
from subagentd.worker import Worker

TIMEOUT = 10


class Scripted(workers_pb2_grpc.WorkerServiceServicer):
    """Each session: records the hello and the events, answers per `plan`."""

    def __init__(self):
        self.hellos: "queue.Queue[workers_pb2.WorkerHello]" = queue.Queue()
        self.events: "queue.Queue[workers_pb2.RunEvent]" = queue.Queue()
        # What each session sends after its welcome; None ends the session.
        self.outgoing: "queue.Queue[queue.Queue]" = queue.Queue()

    def Connect(self, request_iterator, context):
        out: "queue.Queue" = queue.Queue()
        self.outgoing.put(out)
        hello = next(request_iterator).hello
        self.hellos.put(hello)

        def read():
            try:
                for request in request_iterator:
                    self.events.put(request.event)
            except Exception:  # grpc ends the iterator this way once the session is over
                return

        threading.Thread(target=read, daemon=True).start()
        yield workers_pb2.ConnectResponse(welcome=workers_pb2.Welcome(worker_id="w"))
        while True:
            message = out.get(timeout=TIMEOUT)
            if message is None:
                return
            yield message


class ReleaseTest(unittest.TestCase):
    def test_a_finished_run_is_held_until_released_and_its_end_sent_again(self):
        service = Scripted()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        workers_pb2_grpc.add_WorkerServiceServicer_to_server(service, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        worker = Worker(
            f"127.0.0.1:{port}",
            agents=["coder"],
            handler=lambda run: (run.usage(input_tokens=7), "the result")[1],
            reconnect_delay=0.05,
        )
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        try:
            # Session 1: the run is assigned and finishes; the session ends
            # before any `released` (the server crashed).
            out = service.outgoing.get(timeout=TIMEOUT)
            self.assertEqual(list(service.hellos.get(timeout=TIMEOUT).held_runs), [])
            agent = pb.Agent(id="a1", attempt=1)
            out.put(workers_pb2.ConnectResponse(assign=workers_pb2.RunAssignment(agent=agent, prompt="p")))
            usage = service.events.get(timeout=TIMEOUT)
            done = service.events.get(timeout=TIMEOUT)
            self.assertEqual((usage.seq, usage.attempt, usage.usage.input_tokens), (1, 1, 7))
            self.assertEqual((done.seq, done.WhichOneof("event"), done.done.result), (2, "done", "the result"))
            out.put(None)

            # Session 2: the hello names the finished run, its `done` comes
            # again; then the server releases it.
            out = service.outgoing.get(timeout=TIMEOUT)
            held = service.hellos.get(timeout=TIMEOUT).held_runs
            self.assertEqual([(h.agent_id, h.attempt) for h in held], [("a1", 1)])
            again = [service.events.get(timeout=TIMEOUT) for _ in range(2)]
            self.assertEqual(again, [usage, done], "every report again, same numbers")
            out.put(workers_pb2.ConnectResponse(released=workers_pb2.RunReleased(agent_id="a1", attempt=1)))
            out.put(None)

            # Session 3: nothing is held any more.
            service.outgoing.get(timeout=TIMEOUT)
            self.assertEqual(list(service.hellos.get(timeout=TIMEOUT).held_runs), [])
            self.assertTrue(service.events.empty(), "no event was sent twice more")
        finally:
            worker.stop()
            thread.join(TIMEOUT)
            server.stop(0)


if __name__ == "__main__":
    unittest.main()
