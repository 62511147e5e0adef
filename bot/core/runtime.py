"""The runtime: what adapters talk to, and what drives cycles on this replica.

Adapters call `ingest()` for each platform message and acknowledge the platform only after it
returns. Wake-ups (local timers and the sweep) start cycles; a conversation never runs two
cycles in one process, and the lease keeps it to one across processes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from bot import log_lines
from bot.cancel import cancel_and_wait
from bot.commands import COMMANDS, RATE_LIMITED, REFUSAL, command_of
from bot.config.settings import Settings
from bot.core.admission import ALLOWED, DENIED, group_allowed, group_switch, heard, verdict
from bot.core.cycle import Cycle
from bot.core.heartbeat import Heartbeat
from bot.core.race import Next
from bot.core.reload import reloaded
from bot.core.roles import HANDOVER_S, run_exclusively
from bot.core.timers import Timers
from bot.core.typing_signals import TypingSignals
from bot.llm.base import LLM
from bot.llm.transcribe import Transcriber
from bot.loop_lag import watch
from bot.message import (
    InboundMessage,
    MenuEntry,
    Outbound,
    Place,
    SeesTyping,
    Unavailable,
    platform_id,
)
from bot.outbound.pacing import Paced
from bot.outbound.typing_indicator import Typing
from bot.stats import Stats
from bot.store import RETRY_AFTER_ERROR_MS, Store, StoreSettings
from bot.tools import Toolbox
from bot.traces import Attribute, Tracing, conversation_id, tracing_of

log = logging.getLogger(__name__)

# Notices (a refusal, a rate-limit warning) go out in the background, never inside ingest: a
# 429 on one would otherwise stall intake for everyone behind the single poller or gateway.
# Each is bounded in time, and so is how many may be in flight; beyond that they are dropped
# (they are best effort: the message they concern was dropped on purpose anyway).
NOTICE_TIMEOUT_S = 30.0
NOTICES_IN_FLIGHT = 100
# A user outside the allow-list is told so at most once per this period.
REFUSAL_PERIOD_MS = 24 * 3600 * 1000
# A moved group's conversations are carried to its new chat within ADOPT_TIMEOUT_S (whoever's
# is not by then starts afresh there); the adapter that reported the move waits ADOPT_WAIT_S
# for it at most, then goes on while it runs. The moves this process carried (or is carrying)
# are remembered, at most MOVES_KEPT, so a move reported again (every send to the old chat
# reports it) costs no second walk through the store.
ADOPT_TIMEOUT_S = 120.0
ADOPT_WAIT_S = 2.0
MOVES_KEPT = 1000


class Runtime:
    def __init__(
        self,
        settings: Settings,
        store: Store,
        llm: LLM,
        outbound: Outbound,
        transcriber: Transcriber | None = None,
        toolbox: Toolbox | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        # One trace per burst, across replicas: off unless the settings turn it on.
        self.tracing = tracing or tracing_of(settings)
        # Every call to the platform paced by the bot's outbound budget.
        self.outbound = Paced(
            outbound, store, settings.platform, settings.replica_id, mode=settings.outbound.budget
        )
        self.cycle = Cycle(settings, store, llm, self.outbound, transcriber, toolbox, self.tracing)
        self.typing = Typing(self.outbound)
        # Whom the platform reports typing for (None: nobody), and which signals go on.
        self._sees_typing = outbound if isinstance(outbound, SeesTyping) else None
        self._signals = TypingSignals()
        self.timers = Timers(self.wake, store.due, settings.sweep_interval_ms / 1000)
        self._running: dict[str, asyncio.Task[None]] = {}
        self._notices: set[asyncio.Task[None]] = set()
        # A moved group's adoption of its conversations, by (platform, old chat, new chat).
        self._moves: dict[tuple[str, str, str], asyncio.Task[bool]] = {}
        self._accepting = False
        self._draining = asyncio.Event()
        self._role_runners: set[asyncio.Task[None]] = set()
        # The roles (such as "telegram:poller") this replica holds right now.
        self.roles: set[str] = set()
        self.heartbeat = Heartbeat(
            store, settings.replica_id, platform=settings.platform, info=self.report
        )

    @property
    def stats(self) -> Stats:
        return self.cycle.stats

    def start(self) -> None:
        # The event loop's lag, watched for the replica's whole life: logged when it stalls,
        # exported in the metrics, and what sheds drafts and typing.
        watch()
        self.timers.start()
        self.heartbeat.start()
        self._accepting = True

    def report(self) -> dict[str, str | int]:
        """What this replica is doing, for its heartbeat and systemd's status line."""
        return {
            "cycles": len(self._running),
            "roles": ",".join(sorted(self.roles)) or "-",
            "accepting": int(self._accepting),
        }

    async def ingest(self, message: InboundMessage) -> bool:
        """Take one platform message in. Returns False if it was dropped: empty, a
        redelivery, a user outside the allow-list, or over the rate limit. Raises
        `Unavailable` if it could not be stored: do not acknowledge it then."""
        if not self._accepting:
            raise Unavailable("this replica is shutting down")
        message = message.cleaned(self.settings.max_message_chars)
        if not message.text.strip() and not message.attachments:
            return False
        with log_lines.about(message.conversation):
            return await self._ingest(message)

    async def _ingest(self, message: InboundMessage) -> bool:
        conversation = message.conversation
        stats = self.stats
        who = verdict(self.settings.access, message.user_id)
        groups = self.settings.groups
        switch = group_switch(message, groups.wake_words)
        if switch is not None and who == "admin":
            await self.store.allow_group(conversation, switch, message.user_id)
            self._notify(conversation, ALLOWED if switch else DENIED, message)
            return False
        typing = self._typing_ms(message.place) > 0
        candidate, started_ns = self.tracing.candidate(), time.time_ns()
        result = await self.store.ingest(
            message, who, heard(message, groups), typing=typing, trace=candidate
        )
        if result.trace:
            attributes: dict[str, Attribute] = {
                "gen_ai.conversation.id": conversation_id(conversation),
                "lastword.version": result.version,
                "lastword.window": "opened" if result.opened_window else "extended",
                "lastword.window.capped": result.capped,
            }
            command = command_of(message.text)
            if command is not None:
                # The command's name (a /stop shows what cut a generation), never the rest of
                # what was typed; a name lastword does not know is "unknown".
                attributes["lastword.command"] = command if command in COMMANDS else "unknown"
            began = result.trace == candidate
            self.tracing.ingested(
                result.trace, result.follows, started_ns, began=began, **attributes
            )
        if result.silent or result.overheard:
            stats.overheard += result.overheard
            return False
        if result.refused:
            stats.refused += 1
            # Never stored, so never near the model; told once a day, by whichever replica.
            if await self.store.notice_once(conversation, REFUSAL_PERIOD_MS):
                self._notify(conversation, REFUSAL, message, "refused")
            return False
        stats.ingested += result.accepted
        stats.rate_limited += result.limited
        stats.duplicates += not result.accepted and not result.limited
        stats.windows_opened += result.opened_window
        stats.windows_capped += result.capped
        if result.first_limited:
            self._notify(conversation, RATE_LIMITED, message, f"limited:{message.message_id}")
        if result.accepted:
            # Before anything else: a generation of this conversation running here is stale.
            self.cycle.watch.moved(conversation, result.version)
            self._signals.message(conversation)
            self.typing.show(conversation)
            self._look_again(conversation, result.look_in_ms)
        return result.accepted

    async def group_moved(self, platform: str, old_chat: str, new_chat: str) -> None:
        """The group `old_chat` lives on as `new_chat`: its allowance (the settings', or an
        admin's) goes with it, so the bot answers there as it did in the old one, even if the
        settings list the old id only; and each person's conversation there is adopted by
        theirs in the new chat (history, persona, model, tool record: `Store.adopt_group`),
        so they go on where they were. The old conversations stay (their pending replies reach
        the new chat through the adapter, which the platform redirects, and are kept there).

        Raises `Unavailable` if the allowance could not be moved (the adapter tries again).
        The adoption never raises: it runs in the background, awaited here for
        `ADOPT_WAIT_S` at most so that the messages the adapter takes in after the move
        usually find it done, and once per move in this process unless it failed."""
        by_settings = group_allowed(self.settings.groups, old_chat)
        carried = await self.store.move_group(platform, old_chat, new_chat, by_settings=by_settings)
        if carried is not None:
            log.info(
                "group %s:%s moved to %s, %s there",
                platform,
                old_chat,
                new_chat,
                "allowed" if carried else "denied",
            )
        move = (platform, old_chat, new_chat)
        adoption = self._moves.get(move)
        if adoption is None or (adoption.done() and not _succeeded(adoption)):
            if len(self._moves) >= MOVES_KEPT:
                for done in [key for key, task in self._moves.items() if task.done()]:
                    del self._moves[done]
            adoption = asyncio.create_task(self._adopt(*move), name=f"adopt {old_chat}")
            self._moves[move] = adoption
        # Not cancelled when the wait ends (nor when this call is): it goes on by itself.
        await asyncio.wait({adoption}, timeout=ADOPT_WAIT_S)

    async def _adopt(self, platform: str, old_chat: str, new_chat: str) -> bool:
        """Adopt the moved group's conversations in the new chat, within `ADOPT_TIMEOUT_S`.
        Returns whether it got through; a failure is logged, never raised: whoever did not
        get their conversation over starts afresh in the new chat."""
        try:
            async with asyncio.timeout(ADOPT_TIMEOUT_S):
                adopted = await self.store.adopt_group(platform, old_chat, new_chat)
        except (Unavailable, TimeoutError) as exc:
            log.warning(
                "the conversations of group %s:%s were not all carried to %s: %s",
                platform,
                old_chat,
                new_chat,
                str(exc) or "timed out",
            )
            return False
        except Exception:
            log.exception(
                "carrying the conversations of group %s:%s to %s failed",
                platform,
                old_chat,
                new_chat,
            )
            return False
        if adopted.capped:
            log.warning(
                "group %s:%s has more than %d conversations: only those were carried to %s",
                platform,
                old_chat,
                adopted.found,
                new_chat,
            )
        if adopted.found:
            log.info(
                "group %s:%s moved to %s: %d of its %d conversations carried there",
                platform,
                old_chat,
                new_chat,
                adopted.adopted,
                adopted.found,
            )
        return True

    async def user_typing(self, place: Place) -> None:
        """The person at `place` is typing: their open window is held (as long as the
        platform's signal lasts), and a speculative generation for it cut. Best effort: a
        signal lost costs a window that may close early, never a message."""
        hold_ms = self._typing_ms(place)
        if not hold_ms or not self._accepting:
            return
        conversation = place.conversation
        if not self._signals.due(conversation):
            return
        with log_lines.about(conversation):
            started_ns = time.time_ns()
            try:
                typed = await self.store.typing(conversation, hold_ms)
            except Unavailable as exc:
                log.debug("a typing signal of %s was not counted: %s", conversation, exc)
                return
            except Exception:
                log.exception("a typing signal of %s failed", conversation)
                return
        stats = self.stats
        stats.typing_signals += 1
        stats.typing_held += typed.held
        stats.typing_cut += bool(typed.cut)
        if typed.cut:
            self.cycle.watch.cut(conversation, typed.cut)
        if typed.held:
            self._look_again(conversation, typed.look_in_ms)
            self.tracing.noted(
                "typing",
                typed.trace,
                started_ns,
                **{
                    "lastword.window.held_ms": typed.look_in_ms or 0,
                    "lastword.cut": bool(typed.cut),
                },
            )

    def _typing_ms(self, place: Place) -> int:
        """How long a typing signal of the person at `place` holds their window (0: their
        platform does not report it, or typing is off)."""
        sees = self._sees_typing
        hold_ms = self.settings.debounce.typing_ms
        return hold_ms if hold_ms and sees is not None and sees.sees_typing(place) else 0

    def _notify(self, conversation: str, text: str, about: InboundMessage, key: str = "") -> None:
        """Send a notice outside any reply, in the background (in a group, as a reply to the
        message it is `about`)."""
        if len(self._notices) >= NOTICES_IN_FLIGHT:
            log.warning("too many notices in flight; not telling %s: %s", conversation, text)
            return
        reply_to = None if about.is_dm else platform_id(about.message_id)
        key = key or about.message_id
        task = asyncio.create_task(self._send_notice(conversation, text, key, reply_to))
        self._notices.add(task)
        task.add_done_callback(self._notices.discard)

    async def _send_notice(
        self, conversation: str, text: str, key: str, reply_to: str | None
    ) -> None:
        try:
            async with asyncio.timeout(NOTICE_TIMEOUT_S):
                key = f"{conversation}:notice:{key}"
                await self.outbound.send(conversation, text, key, reply_to=reply_to)
        except Exception as exc:
            log.warning("could not send a notice to %s: %s", conversation, exc or "timed out")

    def wake(self, conversation: str) -> None:
        """Start a cycle for `conversation` unless this process already runs one, or is
        draining: what it stores while it hands its roles over is another replica's to
        answer (a cycle begun now would only be cut short by the stop)."""
        if conversation in self._running or self._draining.is_set():
            return
        task = asyncio.create_task(self._cycle(conversation), name=f"cycle {conversation}")
        self._running[conversation] = task

    async def _cycle(self, conversation: str) -> None:
        with log_lines.about(conversation):
            await self._cycle_logged(conversation)

    async def _cycle_logged(self, conversation: str) -> None:
        try:
            self.typing.show(conversation)
            # A failure with the lease held is backed off in the store, for every replica.
            after = await self.cycle.run(conversation)
        except Exception as exc:
            # Without the lease (the acquire failed): the conversation stays in the due-index,
            # so look again soon, here or by any replica's sweep.
            after = Next(RETRY_AFTER_ERROR_MS, working=False)
            if isinstance(exc, Unavailable):
                log.warning("cycle for %s could not start: %s", conversation, exc)
            else:
                log.exception("cycle for %s could not start", conversation)
        finally:
            self._running.pop(conversation, None)
        self._look_again(conversation, after.look_in_ms)
        if not after.working:
            self.typing.hide(conversation)

    def _look_again(self, conversation: str, look_in_ms: int | None) -> None:
        if look_in_ms is not None:
            self.timers.arm(conversation, look_in_ms)

    async def settled(self, conversation: str, poll_s: float = 0.05) -> None:
        """Wait until every accepted message of `conversation` has been answered."""
        while True:
            try:
                version, watermark = await self.store.counters(conversation)
                if version == watermark and conversation not in self._running:
                    return
            except Unavailable:
                pass
            await asyncio.sleep(poll_s)

    async def recent(self, platform: str, within_s: float) -> dict[str, str]:
        """Conversations on `platform` active in the last `within_s` seconds, each with the
        platform id of the last message taken in from it."""
        return await self.store.recent(platform, int(within_s * 1000))

    async def remember(self, name: str, value: str | None, ttl_s: float) -> None:
        await self.store.remember(name, value, int(ttl_s * 1000))

    async def recall(self, name: str) -> str | None:
        return await self.store.recall(name)

    async def throttled(self, scope: str, retry_after_s: float) -> None:
        await self.outbound.throttled(scope, retry_after_s)

    def menu(self, *, admins: bool = False) -> tuple[MenuEntry, ...]:
        """The commands of a platform's menu, in /help's order: everyone's, and with `admins`
        the admin ones after them (what an admin's /help lists)."""
        return tuple(
            MenuEntry(c.name, c.help, c.shape, c.admin)
            for c in COMMANDS.values()
            if admins or not c.admin
        )

    async def run_exclusively(self, name: str, work: Callable[[], Awaitable[None]]) -> None:
        """Run `work()` only while this replica holds the role `name`, one replica at a time
        across the deployment, handing over within the lease TTL if the holder dies. See
        `bot.core.roles.run_exclusively`."""

        async def holding() -> None:
            self.roles.add(name)
            try:
                await work()
            finally:
                self.roles.discard(name)

        runner = asyncio.create_task(
            run_exclusively(
                self.store,
                name,
                holding,
                self.settings.lease.ttl_ms,
                owner=self.settings.replica_id,
            ),
            name=f"role {name}",
        )
        self._role_runners.add(runner)
        runner.add_done_callback(self._role_runners.discard)
        draining = asyncio.create_task(self._draining.wait())
        try:
            await asyncio.wait({runner, draining}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            draining.cancel()
            if not runner.done():
                # Shutting down: hand the role over now, so another replica polls or holds
                # the gateway while this one finishes its replies. One cancel, then time to
                # wind down: the work may still store what it has queued.
                await cancel_and_wait(runner, retry_s=HANDOVER_S)
        if runner.cancelled() and self._draining.is_set():
            # Stay here, so the adapter keeps its client open for the last replies, until
            # the shutdown cancels the adapter.
            await asyncio.Event().wait()
        await runner

    def reload(self, new: Settings) -> tuple[list[str], list[str]]:
        """Apply the settings that can change while running (prompt, limits, allow-list,
        timings...). Returns the names of the settings applied, and of those that changed but
        need a restart (platform, store, credentials, addresses)."""
        self.settings, applied, fixed = reloaded(self.settings, new)
        self.store.configure(StoreSettings.of(self.settings))
        self.cycle.configure(self.settings)
        return applied, fixed

    @property
    def accepting(self) -> bool:
        return self._accepting

    @property
    def cycles_running(self) -> int:
        return len(self._running)

    async def drain(self, grace_s: float) -> None:
        """The first half of a graceful stop: take nothing new in and start no new cycle, and
        give the cycles already running up to `grace_s` to deliver their replies.

        Roles go first, while messages are still taken in: the poller or gateway holder
        stores what it has already received, then hands its role to another replica."""
        began = asyncio.get_running_loop().time()
        self._draining.set()
        if self._role_runners:
            await asyncio.wait(set(self._role_runners), timeout=HANDOVER_S + 0.5)
        self._accepting = False
        await self.timers.stop()
        running = list(self._running.values())
        left_s = max(grace_s - (asyncio.get_running_loop().time() - began), 0.0)
        if running and left_s > 0:
            log.info("waiting up to %.1fs for %d cycles to finish", left_s, len(running))
            _, late = await asyncio.wait(running, timeout=left_s)
            if late:
                log.info("%d cycles still running; handing their conversations back", len(late))

    async def stop(self) -> None:
        """Stop accepting, cancel cycles (each hands its lease back) and stop the timers.
        Nothing accepted is lost: it is in the store, and any replica will finish it."""
        self._accepting = False
        await self.timers.stop()
        # Each cancelled cycle hands its lease back on the way out.
        await asyncio.gather(*(cancel_and_wait(t) for t in list(self._running.values())))
        # Their places in the outbound budget's queues, given back on the way out too.
        await self.outbound.stop()
        # Hand-backs still waiting for the store: the leases expire by themselves.
        await self.cycle.hand_backs.stop()
        await self.cycle.watch.stop()
        # The media workers: after the cycles, which may have been waiting on them.
        await self.cycle.media.close()
        for notice in list(self._notices):
            notice.cancel()
        for adoption in self._moves.values():
            adoption.cancel()
        self.typing.stop()
        await self.heartbeat.stop()
        # What is left of the traces, flushed within a few seconds (a thread: it blocks).
        await asyncio.to_thread(self.tracing.shutdown)


def _succeeded(task: asyncio.Task[bool]) -> bool:
    """Whether a finished task got through (a cancelled one did not)."""
    return not task.cancelled() and task.result()
