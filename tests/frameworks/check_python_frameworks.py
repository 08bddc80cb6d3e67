"""Python voice-agent frameworks, unchanged, through the gateway against its
simulator, each configured only through its own documented settings:

- openai-agents (`RealtimeRunner`, `model_config={"url", "api_key"}`): a
  tool-call round trip with the framework's own `@function_tool`, the
  answer after it, an answer it interrupts (`session.interrupt()`: the
  cancelled response is billed as `cancelled`, 499), and a clean close;
- LiveKit Agents (`livekit-plugins-openai` `RealtimeModel(base_url=…,
  api_key=…)` in an `AgentSession` without a room, as its test mode runs
  it): a tool-call round trip with an `Agent`'s own `@function_tool` (it
  matches its own item ids and `response.metadata.client_event_id`, and
  needs `response.output_item.added` before the deltas), an answer it
  interrupts (`session.interrupt()`), and `aclose()`;
- pipecat (`OpenAIRealtimeLLMService(api_key=…, base_url=…)` in a pipeline
  with its context aggregators): a tool-call round trip with a function
  registered on the service (`register_function`) and declared in the
  context's `ToolsSchema`, an answer cancelled by an `InterruptionFrame`
  (server turn detection off, as with local VAD: the service then sends
  `response.cancel`), and the pipeline's `EndFrame`.

Every turn is a request-log row on the gateway's stdout: the check asserts
their count, key, cost and outcome (the interrupted answer `cancelled`,
499), and that a client's close is over in under a second.

Usage: python check_python_frameworks.py <patchbay-gateway binary>
Starts `sim` and `serve` on free 127.0.0.1 ports; everything started is
stopped on exit. Prints `python frameworks: N passed, N failed`.
"""

import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.request

CLIENT_KEY = "pb-frameworks"
UPSTREAM_KEY = "sk-sim-frameworks"
MODEL = "gpt-realtime"
DEADLINE_S = 30


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str) -> None:
    deadline = time.time() + DEADLINE_S
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} never answered 200")


def rows(rows_file: str) -> list:
    out = []
    with open(rows_file) as f:
        for line in f:
            if line.startswith("{"):
                out.append(json.loads(line))
    return out


async def openai_agents_tool_round_trip(ws_base: str) -> float:
    """Returns how long the session's close took."""
    from agents import function_tool
    from agents.realtime import RealtimeAgent, RealtimeRunner

    called_with = []

    @function_tool
    def lookup_order(order_id: str) -> str:
        """Looks an order up by its id."""
        called_with.append(order_id)
        return "shipped yesterday"

    agent = RealtimeAgent(name="Support", instructions="Help with orders.", tools=[lookup_order])
    runner = RealtimeRunner(agent)
    session = await runner.run(
        model_config={"url": f"{ws_base}/realtime?model={MODEL}", "api_key": CLIENT_KEY}
    )
    responses = 0
    tool_ended = False
    async with session:
        await session.send_message("Please lookup_order 42 for me.")
        async for event in session:
            if event.type == "error":
                raise AssertionError(f"error event: {event.error}")
            if event.type == "tool_end":
                tool_ended = True
            if event.type == "raw_model_event" and getattr(event.data, "type", "") == "raw_server_event":
                if event.data.data.get("type") == "response.done":
                    responses += 1
            if tool_ended and responses >= 2:
                break
        # An interrupted answer: the framework cancels it mid-audio.
        await session.send_message("Tell me a long story.")
        interrupted = False
        async for event in session:
            if event.type != "raw_model_event" or getattr(event.data, "type", "") != "raw_server_event":
                continue
            kind = event.data.data.get("type")
            if kind == "response.output_audio.delta" and not interrupted:
                await session.interrupt()
                interrupted = True
            if kind == "response.done":
                status = event.data.data["response"]["status"]
                assert interrupted and status == "cancelled", status
                break
        started = time.monotonic()
    closed_in = time.monotonic() - started
    assert called_with == ["sim"], called_with
    return closed_in


async def livekit_agent(http_base: str, billed) -> float:
    """A tool-call round trip, an interrupted answer and a close through an
    `AgentSession` (no room: its documented test mode, `session.run`).
    `billed(n)` waits for the n-th row of this check. Returns how long the
    close took."""
    import aiohttp
    from livekit.agents import Agent, AgentSession, function_tool
    from livekit.plugins.openai import realtime

    called_with = []

    class Support(Agent):
        def __init__(self):
            super().__init__(instructions="Help with orders.")

        @function_tool
        async def lookup_order(self, order_id: str) -> str:
            """Looks an order up by its id."""
            called_with.append(order_id)
            return "shipped yesterday"

    async with aiohttp.ClientSession() as http:
        model = realtime.RealtimeModel(
            model=MODEL, base_url=http_base, api_key=CLIENT_KEY, http_session=http
        )
        session = AgentSession(llm=model)
        await session.start(Support())
        # The framework runs the tool and answers with its output.
        result = await session.run(user_input="Please lookup_order 42 for me.")
        kinds = [e.type for e in result.events]
        assert kinds == ["function_call", "function_call_output", "message"], kinds
        assert called_with == ["sim"], called_with
        await billed(2)
        # An answer interrupted once it is being spoken: the framework
        # cancels it (`response.cancel`).
        speaking = asyncio.Event()
        session.on("agent_state_changed", lambda ev: ev.new_state == "speaking" and speaking.set())
        handle = session.generate_reply(user_input="Tell me a long story.")
        await speaking.wait()
        await session.interrupt()
        await handle
        assert handle.interrupted
        await billed(3)
        started = time.monotonic()
        await session.aclose()
    return time.monotonic() - started


async def pipecat_agent(ws_base: str, billed) -> float:
    """A tool-call round trip (a function registered with the service and
    declared in the context's tools), an interrupted answer (an
    `InterruptionFrame`, with server turn detection off as for local VAD)
    and the pipeline's end, through `OpenAIRealtimeLLMService` in a
    pipeline with its context aggregators. Returns how long the end took,
    from the `EndFrame` to the runner's return."""
    import warnings

    warnings.simplefilter("ignore", DeprecationWarning)
    from loguru import logger

    # pipecat logs every frame at DEBUG.
    logger.remove()
    logger.add(sys.stderr, level="ERROR")
    from pipecat.adapters.llm.schemas.function_schema import FunctionSchema
    from pipecat.adapters.llm.schemas.tools_schema import ToolsSchema
    from pipecat.frames.frames import (
        EndFrame,
        InterruptionFrame,
        LLMFullResponseEndFrame,
        LLMMessagesAppendFrame,
        LLMRunFrame,
        TTSAudioRawFrame,
    )
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.runner import PipelineRunner
    from pipecat.pipeline.task import PipelineTask
    from pipecat.processors.aggregators.llm_context import LLMContext
    from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
    from pipecat.processors.frame_processor import FrameProcessor
    from pipecat.services.openai.realtime import events
    from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService

    class Sink(FrameProcessor):
        def __init__(self):
            super().__init__()
            self.audio = 0
            self.answers = 0
            self.changed = asyncio.Event()

        async def process_frame(self, frame, direction):
            await super().process_frame(frame, direction)
            if isinstance(frame, TTSAudioRawFrame):
                self.audio += 1
                self.changed.set()
            if isinstance(frame, LLMFullResponseEndFrame):
                self.answers += 1
                self.changed.set()
            await self.push_frame(frame, direction)

        async def until(self, done):
            while not done():
                self.changed.clear()
                await self.changed.wait()

    called_with = []

    async def lookup_order(params):
        called_with.append(params.arguments.get("order_id"))
        await params.result_callback("shipped yesterday")

    manual_turns = events.SessionProperties(
        audio=events.AudioConfiguration(input=events.AudioInput(turn_detection=False))
    )
    llm = OpenAIRealtimeLLMService(
        api_key=CLIENT_KEY,
        base_url=f"{ws_base}/realtime",
        settings=OpenAIRealtimeLLMService.Settings(model=MODEL, session_properties=manual_turns),
    )
    llm.register_function("lookup_order", lookup_order)
    tools = ToolsSchema(
        standard_tools=[
            FunctionSchema(
                name="lookup_order",
                description="Looks an order up by its id.",
                properties={"order_id": {"type": "string"}},
                required=["order_id"],
            )
        ]
    )
    context = LLMContext([{"role": "user", "content": "Please lookup_order 42 for me."}], tools=tools)
    aggregators = LLMContextAggregatorPair(context)
    sink = Sink()
    task = PipelineTask(Pipeline([aggregators.user(), llm, sink, aggregators.assistant()]))
    ended = {}

    async def drive():
        await task.queue_frames([LLMRunFrame()])
        # The call's response, then the answer to the tool's output.
        await sink.until(lambda: called_with and sink.answers >= 2)
        assert called_with == ["sim"], called_with
        assert sink.audio > 0, "no audio"
        await billed(2)
        heard = sink.audio
        await llm.queue_frame(
            LLMMessagesAppendFrame([{"role": "user", "content": "Tell me a long story."}], run_llm=True)
        )
        await sink.until(lambda: sink.audio > heard)
        await task.queue_frame(InterruptionFrame())
        await billed(3)
        ended["at"] = time.monotonic()
        await task.queue_frame(EndFrame())

    await asyncio.gather(PipelineRunner(handle_sigint=False).run(task), drive())
    return time.monotonic() - ended["at"]


def main() -> int:
    binary = sys.argv[1]
    sim_port, gw_port, admin_port = free_port(), free_port(), free_port()
    tmp = tempfile.mkdtemp(prefix="patchbay-frameworks-")
    config = os.path.join(tmp, "gateway.toml")
    rows_file = os.path.join(tmp, "rows.jsonl")
    with open(config, "w") as f:
        f.write(
            f'[server]\nlisten = "127.0.0.1:{gw_port}"\nadmin_listen = "127.0.0.1:{admin_port}"\n'
            f'[[routes]]\nmodel = "{MODEL}"\nupstream_url = "ws://127.0.0.1:{sim_port}/v1/realtime"\n'
            f'api_key_env = "FW_UPSTREAM_KEY"\n[metering]\nflush_secs = 0\n'
            f'[[prices]]\nmodel = "{MODEL}"\ntext_input = 4.0\naudio_input = 32.0\n'
            f"text_output = 16.0\naudio_output = 64.0\n"
        )
    env = dict(os.environ, FW_UPSTREAM_KEY=UPSTREAM_KEY, PATCHBAY_MASTER_KEY=CLIENT_KEY)
    procs = [
        subprocess.Popen(
            # Answers of 1 s (25 deltas 40 ms apart), long enough to interrupt.
            [binary, "sim", "--listen", f"127.0.0.1:{sim_port}", "--keys", UPSTREAM_KEY,
             "--audio-deltas", "25", "--delta-interval-ms", "40"],
            stdout=subprocess.DEVNULL,
        ),
        subprocess.Popen([binary, "serve", "--config", config], env=env, stdout=open(rows_file, "w")),
    ]
    passed = failed = 0
    try:
        wait_ready(f"http://127.0.0.1:{admin_port}/readyz")
        ws_base = f"ws://127.0.0.1:{gw_port}/v1"

        def agents_check():
            closed_in = asyncio.run(asyncio.wait_for(openai_agents_tool_round_trip(ws_base), DEADLINE_S))
            # The gateway answers a client's close and ends the connection
            # at once (it does not wait on the upstream's cancel and close).
            assert closed_in < 1.0, f"close took {closed_in:.3f} s"
            deadline = time.time() + DEADLINE_S
            while time.time() < deadline:
                billed = [r for r in rows(rows_file) if r["key_id"] == "master" and r["cost_usd"] > 0]
                cancelled = [r for r in billed if r["end_reason"] == "cancelled" and r["status"] == 499]
                if len(billed) >= 3 and cancelled:
                    return
                time.sleep(0.1)
            raise AssertionError(f"rows: {rows(rows_file)}")

        def agent_check(name, run):
            """Runs `run(billed)`; asserts its rows (three, the client's
            key, each charged, the last cancelled) and its close time."""
            before = len(rows(rows_file))

            async def billed(n):
                deadline = time.monotonic() + DEADLINE_S
                while len(rows(rows_file)) < before + n:
                    assert time.monotonic() < deadline, f"{name}: {n} rows expected, {rows(rows_file)[before:]}"
                    await asyncio.sleep(0.05)

            closed_in = asyncio.run(asyncio.wait_for(run(billed), DEADLINE_S))
            time.sleep(0.5)
            mine = rows(rows_file)[before:]
            assert len(mine) == 3, mine
            assert all(r["key_id"] == "master" and r["cost_usd"] > 0 for r in mine), mine
            outcomes = [(r["status"], r["end_reason"]) for r in mine]
            assert outcomes == [(200, "completed"), (200, "completed"), (499, "cancelled")], outcomes
            assert closed_in < 1.0, f"close took {closed_in:.3f} s"

        def livekit_check():
            http_base = f"http://127.0.0.1:{gw_port}/v1"
            agent_check("livekit", lambda billed: livekit_agent(http_base, billed))

        def pipecat_check():
            agent_check("pipecat", lambda billed: pipecat_agent(ws_base, billed))

        for name, check in [
            ("openai-agents: a tool-call round trip, an interrupted answer, every turn billed, a prompt close", agents_check),
            ("LiveKit Agents: a tool-call round trip, an interrupted answer, every turn billed, a prompt close", livekit_check),
            ("pipecat: a tool-call round trip, an interrupted answer, every turn billed, a prompt close", pipecat_check),
        ]:
            try:
                check()
                passed += 1
                print(f"ok      {name}")
            except Exception:
                failed += 1
                print(f"FAILED  {name}")
                traceback.print_exc()
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
    print(f"python frameworks: {passed} passed, {failed} failed")
    return 0 if failed == 0 and passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
