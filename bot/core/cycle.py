"""One cycle: lease, check, generate once, pre-send check, send, commit (SPEC, steps 2-7).

A cycle runs on whichever replica wins the lease. Everything it needs comes from the store
when the lease is taken, so any replica can finish any conversation. While it works, a
keeper (`bot.core.lease`) renews the lease every TTL/3; once it is lost, the work is cancelled on
the spot. The generation's model steps and tool calls are `bot.core.steps`'s, and racing them
against a newer message is `bot.core.race`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Literal, TypeVar

from bot import log_lines
from bot.backoff import Backoff
from bot.blame import cause_of
from bot.cancel import cancel_and_wait
from bot.commands import (
    NOTHING_TO_RETRY,
    OVER_BUDGET,
    Plan,
    apply,
    budget_of,
    decide,
    decoded,
    encoded,
    model_named,
    plan,
)
from bot.commands.base import Change, CommandContext
from bot.config.settings import ModelChoice, Settings
from bot.core.groups import in_room, replied
from bot.core.hand_backs import HandBacks
from bot.core.history import Retry, conversation_of, last_reply
from bot.core.lease import LeaseKeeper, LeaseLost
from bot.core.race import NOTHING, Next, Race
from bot.core.remembering import FORGETFUL, Remembered, memory_of, remembered
from bot.core.steps import ModelUse, Steps, ToolUse, TurnRecord
from bot.core.watch import VersionWatch
from bot.llm.base import LLM, LLMError, Usage
from bot.llm.media import UNSEEN_NOTE, Media
from bot.llm.others import TOOL_DATA, Others
from bot.llm.prompt import Prompt, estimated_tokens, fit, system_prompt, with_persona
from bot.llm.remembered import MEMORY_NOTE, fact_lines
from bot.llm.transcribe import Transcriber
from bot.message import InboundMessage, Said, SendFailed, Unavailable, Unreachable
from bot.outbound.drafts import drafting, drafts_of
from bot.outbound.pacer import Slot
from bot.outbound.pacing import Paced
from bot.outbound.split import split_message
from bot.stats import Stats
from bot.store import (
    RETRY_AFTER_ERROR_MS,
    Acquired,
    Ended,
    Failed,
    HistoryEntry,
    Lease,
    NotAcquired,
    Outcome,
    PreSend,
    Resend,
    Store,
    StoreUnavailable,
    lease_token,
)
from bot.tokens import Counter
from bot.tools import Tool, Toolbox
from bot.traces import NO_BURST, OFF, Burst, Span, Tracing

log = logging.getLogger(__name__)

T = TypeVar("T")

APOLOGY = "Sorry, I can't answer right now because of a technical problem. Please try again later."
# The reply to a burst whose reply failed `llm.attempts` times in a row: what went wrong, in
# the user's words, so that the conversation moves on (the burst counts as answered).
GAVE_UP = (
    "Sorry, I couldn't answer your last message{s}: {cause}. I've set {them} aside, so "
    "anything you write now gets a fresh answer."
)

# A reply whose sending failed this many times in a row (a transient platform error each
# time, backed off 1, 2, 4... s across replicas: about two minutes) is given up, so one broken
# chat cannot wedge its conversation for ever. A permanent error gives it up at once.
SEND_ATTEMPTS = 8
# A commit the store refused for a moment is tried again this soon, doubling up to the cap,
# for as long as the lease is ours.
COMMIT_RETRY_S = 0.05
COMMIT_RETRY_CAP_S = 1.0
# Characters of a lease token's random part in a reply part's idempotency key.
KEY_SALT_CHARS = 8
# A speculative reply asks the pre-send check, which holds it while its window is open and
# says how much longer; it waits that long and asks again. Bounded all the same: a window that
# never closes is a bug, not a reason to wait.
HOLDS = 5
# A pre-send check the store refused for a moment (a blip, a restart) is made again, backed
# off, for this long: the reply is not thrown away for a blip. A longer outage ends the attempt
# (not counted as one), and the lease goes back as soon as the store answers.
PRESEND_OUTAGE_S = 4.0


def idempotency_key(conversation: str, version: int, index: int, fence: int, token: str) -> str:
    """The idempotency key (Discord: hashed into the nonce) of reply part `index`: the same for
    the same part re-sent from the outbox, new for any other reply. Besides the version it
    names the lease that passed the pre-send check, by its fence and the random part of its
    token: a store that lost its last writes in a crash (LASTWORD_DURABILITY=fast) hands out
    the same version again, and the same fence, but never the same token."""
    salt = token.rpartition("/")[2][:KEY_SALT_CHARS]
    return f"{conversation}:{version}:{index}:{fence}:{salt}"


@dataclass(frozen=True)
class Reply:
    """The one reply to a burst: its text, the completion tokens it cost, what its commands
    change (carried out once it passes the pre-send check), and the version of a confirmed
    /forget among them (0: none), which empties the history at the commit as a /reset does."""

    text: str
    spent: int = 0
    changes: tuple[Change, ...] = ()
    reset: int = 0
    # The tool calls the model's answer made, for the history.
    tools: str = ""
    # The model's own words, the end of `text` ("" for none: commands alone, a notice, an
    # apology), which alone the history shows the model again.
    words: str = ""


def turn_of(grant: Acquired, target: Retry | None) -> int:
    """The id of the turn a reply answers, and of its tool record: a /retry's is the turn of
    the reply it writes again; any other's, the first version of its burst."""
    return target.turn if target is not None else grant.watermark + 1


@dataclass(frozen=True)
class Written:
    """A reply past the pre-send check, in its outbox: the check, to make again after a wait
    for its turn, and whether the starvation guard forces it out whatever comes."""

    reply: Reply
    presend: Callable[[], Awaitable[PreSend]]
    forced: bool = False


@dataclass(frozen=True)
class Request:
    """What the model is asked for one burst: its messages (their files still to be read),
    the history before them, a /retry's target, and the model and persona the user chose."""

    conversation: str
    messages: tuple[InboundMessage, ...]
    history: tuple[HistoryEntry, ...]
    target: Retry | None
    model: ModelChoice | None
    persona: str
    room: tuple[Said, ...] = ()  # in a group: what was said lately to others
    # The person's facts this request shows, and the memory tool bound to them.
    memory: Remembered = FORGETFUL


@dataclass(frozen=True)
class Generation:
    """What one generation came to: the answer (the apology if the model failed), the
    prompt it was asked with (None if interrupted before one was built), what it cost, the
    model chosen (None: the default), and `interrupted`, when a newer message cancelled it,
    saying when to look at the conversation again."""

    text: str
    prompt: Prompt | None
    usage: Usage
    interrupted: Next | None
    model: ModelChoice | None
    # The tool calls it made and what they gave, for the history (empty: none).
    tools: str = ""
    # The text is the apology for a model that failed, not the model's words.
    apology: bool = False

    @property
    def spent(self) -> int:
        """Its completion tokens."""
        return sum(a.completion_tokens for a in self.usage.attempts)


def _joined(*parts: str) -> str:
    """A reply made of parts: command answers, then the model's."""
    return "\n\n".join(p for p in parts if p)


class Cycle:
    def __init__(
        self,
        settings: Settings,
        store: Store,
        llm: LLM,
        outbound: Paced,
        transcriber: Transcriber | None = None,
        toolbox: Toolbox | None = None,
        tracing: Tracing = OFF,
    ) -> None:
        self.settings = settings
        self.store = store
        self.llm = llm
        self.tracing = tracing
        self.outbound = outbound
        self.toolbox = toolbox or Toolbox()
        self.memory = memory_of(settings, store)
        self.hand_backs = HandBacks(store)
        self.stats = Stats()
        self.counter = Counter()
        self.watch = VersionWatch(store, settings.llm.interrupt_poll_ms / 1000)
        self.media = Media(
            settings.media,
            settings.llm.model,
            outbound,
            store,
            transcriber,
            can_see=llm.sees_images,
        )

    def configure(self, settings: Settings) -> None:
        """Take on reloaded settings, the model's with them. The version watch keeps its
        interval (`llm.interrupt_poll_ms` needs a restart)."""
        if settings.memory != self.settings.memory:
            # Only then: a provider's factory may open connections of its own.
            self.memory = memory_of(settings, self.store)
        self.settings = settings
        self.llm.configure(settings.llm)
        self.media.configure(settings.media, settings.llm.model, can_see=self.llm.sees_images)

    async def run(self, conversation: str) -> Next:
        """Do what is owed for `conversation`, and say when to look at it again."""
        token = lease_token(self.settings.replica_id)
        sent_at = time.monotonic()
        try:
            grant = await self.store.acquire(conversation, token)
        except BaseException:
            # The script may have run and only its answer been lost (a timeout, a cut
            # connection, shutdown): the lease may be ours. The token is known, so free it
            # now rather than leave the conversation waiting for the TTL; the release is
            # token-checked, so it is a no-op if the lease is not ours.
            self._hand_back(Lease(conversation, token, 0))
            raise
        if isinstance(grant, NotAcquired):
            if grant.status == "idle":
                self.stats.noop += 1
                return NOTHING
            self.stats.deferred += 1
            # Early: the window is open, and this replica shows typing meanwhile. Busy or
            # backed off: another replica holds it and shows typing, or a failed attempt is
            # backed off. Either way, look again then.
            return Next(grant.look_in_ms, working=grant.status == "early")
        lease = grant.lease
        self.stats.cycles += 1
        self.stats.speculated += grant.window is not None
        keeper = LeaseKeeper(
            f"lease on {conversation}",
            functools.partial(self.store.renew, lease),
            self.store.settings.ttl_ms,
            confirmed_at=sent_at,
            on_failure=self._renewal_failed,
        )
        with log_lines.traced(grant.trace), self.tracing.burst(grant.trace).span("reply") as span:
            span.set("lastword.fence", lease.fence)
            span.set("lastword.speculative", grant.window is not None)
            try:
                return await keeper.run(self._work(grant, keeper, sent_at))
            except LeaseLost:
                self.stats.lost += 1
                span.set("lastword.ended", "lease lost")
                log.warning("lost the lease on %s mid-cycle; nothing sent from here", conversation)
                return NOTHING
            except Exception as exc:
                # A failed attempt (a platform or store error, a bug): hand the conversation
                # back with the next attempt backed off, whichever replica makes it.
                self.stats.failed += 1
                span.failed(type(exc).__name__)
                if isinstance(exc, Unavailable):
                    # An outage: not counted as an attempt (`llm.attempts`), nor worth a
                    # traceback.
                    log.warning("cycle for %s failed: %s", conversation, exc)
                    return await self._back_off(lease, "outage")
                # A warning with its traceback: after `llm.attempts` in a row the burst is
                # answered with an apology, logged once at ERROR (`_gave_up`).
                log.warning("cycle for %s failed; trying again", conversation, exc_info=True)
                return await self._back_off(lease, "failure")
            except BaseException:
                # Shutdown: hand the conversation back now rather than after the TTL.
                span.set("lastword.ended", "stopped")
                await self._await_hand_back(lease)
                raise

    def _span(self, grant: Acquired, name: str) -> contextlib.AbstractContextManager[Span]:
        """A span of the burst `grant` answers, inside the cycle's `reply` span."""
        return self.tracing.burst(grant.trace).span(name)

    def _renewal_failed(self) -> None:
        self.stats.renewal_failures += 1

    def _hand_back(self, lease: Lease, *, failed: Failed | None = None) -> asyncio.Future[Ended]:
        """Release the lease in a task of its own, so that it completes even if the caller is
        cancelled meanwhile. Token-checked: it can never free someone else's lease. One that
        meets an outage is tried again once the store answers (`HandBacks`)."""
        release = asyncio.ensure_future(self.store.release(lease, failed=failed))

        def collected(task: asyncio.Future[Ended]) -> None:
            # Collect its outcome whoever waits for it, or nobody.
            if not task.cancelled() and isinstance(task.exception(), StoreUnavailable):
                self.hand_backs.later(lease, failed)

        release.add_done_callback(collected)
        return release

    async def _await_hand_back(self, lease: Lease) -> None:
        with contextlib.suppress(Exception):
            await asyncio.shield(self._hand_back(lease))

    async def _back_off(self, lease: Lease, failed: Failed) -> Next:
        try:
            ended = await asyncio.shield(self._hand_back(lease, failed=failed))
        except Exception as exc:
            # The store is out of reach too: the hand-back is tried again once it answers (or
            # the lease expires on its own), and the due-index still holds the conversation.
            log.warning("could not hand %s back: %s", lease.conversation, exc)
            return Next(RETRY_AFTER_ERROR_MS, working=False)
        return Next(ended.look_in_ms, working=False)

    async def _work(self, grant: Acquired, keeper: LeaseKeeper, began: float) -> Next:
        lease = grant.lease
        slot: Slot | None = None
        if grant.resend is not None:
            text, version = await self._resend(grant.resend, grant.lease.conversation, keeper)
            # Whose pre-send check the reply passed: the crashed holder's.
            sent_by = (grant.resend.fence, grant.resend.token)
        else:
            written = await self._write(grant, keeper, began)
            if isinstance(written, Next):
                return written
            with self._span(grant, "outbound wait") as span:
                turn = await self._turn(grant, keeper, written)
                span.set("lastword.waited", turn is not None)
            if isinstance(turn, Next):
                return turn
            if turn == "expired":
                return await self._expired(lease)
            try:
                # Only now, about to go: a reply superseded while it waited changes nothing.
                await apply(self.store, lease.conversation, written.reply.changes, self.memory)
            except BaseException:
                await self.outbound.give_back(turn)
                raise
            text, slot, version = written.reply.text, turn, grant.version
            sent_by = (lease.fence, lease.token)
        with self._span(grant, "send") as span:
            outcome = await self._deliver(lease, text, version, sent_by, keeper, grant, slot)
            span.set("lastword.outcome", outcome)
            span.set("lastword.resend", grant.resend is not None)
        with self._span(grant, "commit"):
            ended = await self._commit(lease, outcome)
        if outcome == "sent":
            self.stats.replies += 1
        return Next(ended.look_in_ms, working=ended.look_in_ms is not None)

    async def _turn(
        self, grant: Acquired, keeper: LeaseKeeper, written: Written
    ) -> Slot | Next | Literal["expired"] | None:
        """The reply's turn in the outbound budget, its slot (None: not paced), waited for in
        its outbox, behind the replies whose window closed first: however long a hold lasts,
        it is not generated again. A newer message meanwhile supersedes it, as it would the
        generation (`Next`: the outbox dropped, one new reply covers everything), unless the
        starvation guard forces it out; one that came just before the turn did is caught by
        the pre-send check, made again after any wait. "expired": it waited longer than
        `outbound.max_reply_age_s`."""
        conversation = grant.lease.conversation
        max_age_s = self.settings.outbound.max_reply_age_s

        async def turn() -> Slot | None:
            async with asyncio.timeout(max_age_s or None):
                return await self.outbound.turn(conversation, grant.closes_at_ms)

        follow = not written.forced
        try:
            async with self._interruptible(grant, keeper, follow=follow, waiting=True) as race:
                slot = await race(turn())
        except TimeoutError:
            return "expired"
        if isinstance(slot, Next):
            self.stats.discarded += 1
            self.stats.discarded_tokens += written.reply.spent
            log.info(
                "superseded a reply waiting its turn for %s: new messages arrived", conversation
            )
            return slot
        if slot is None or not slot.waited or written.forced:
            return slot
        try:
            verdict = await written.presend()
        except BaseException:
            await self.outbound.give_back(slot)
            raise
        if verdict.status in ("lost", "stale"):
            await self.outbound.give_back(slot)
            return self._not_sent(grant, keeper, written.reply, verdict)
        return slot

    async def _expired(self, lease: Lease) -> Next:
        """A reply that waited for its turn longer than `outbound.max_reply_age_s`: too old to
        be worth sending, it is given up (its messages count as answered), said in one line."""
        self.stats.abandoned += 1
        log.warning(
            "dropped the reply to %s: it waited for the platform longer than "
            "LASTWORD_OUTBOUND__MAX_REPLY_AGE_S (%gs)",
            lease.conversation,
            self.settings.outbound.max_reply_age_s,
        )
        ended = await self._commit(lease, "abandoned")
        return Next(ended.look_in_ms, working=ended.look_in_ms is not None)

    async def _resend(
        self, resend: Resend, conversation: str, keeper: LeaseKeeper
    ) -> tuple[str, int]:
        """A holder crashed after its pre-send check: the same text goes out again, never a
        freshly generated one. First make sure the lease is still ours: a pause after the
        acquire may have let another replica resend and commit it."""
        await keeper.ensure_fresh(always=True)
        self.stats.resent += 1
        log.info("resending the reply left in the outbox of %s", conversation)
        # What its commands change: carried out again, as its holder may have died first.
        await apply(self.store, conversation, decoded(resend.changes), self.memory)
        return resend.text, resend.version

    async def _write(self, grant: Acquired, keeper: LeaseKeeper, began: float) -> Written | Next:
        """The reply to the burst, once it has passed the pre-send check (it is in the outbox);
        `Next` if it was interrupted or found stale."""
        lease = grant.lease
        self.stats.lateness_ms.append(grant.lateness_ms)
        self.stats.lateness.observe(grant.lateness_ms)
        burst = plan(grant.watermark, grant.unanswered, self.settings.access.admins)
        target = last_reply(grant.history) if burst.retry and burst.keeps_history else None
        if burst.retry and target is None:
            burst = replace(burst, answers=(*burst.answers, NOTHING_TO_RETRY))
        reply = await self._reply_or_give_up(grant, burst, keeper, target)
        if isinstance(reply, Next):
            return reply

        async def presend() -> PreSend:
            return await self._through_outage(lease, check)

        def check() -> Awaitable[PreSend]:
            return self.store.presend(
                lease,
                grant.version,
                reply.text,
                reset=max(burst.reset, reply.reset),
                replaces=target.version if target else 0,
                unsaid=burst.retry,
                changes=encoded(reply.changes),
                worked_ms=int((time.monotonic() - began) * 1000),
                tools=reply.tools,
                turn=turn_of(grant, target),
                words=reply.words,
            )

        with self._span(grant, "presend") as span:
            verdict = await self._when_closed(grant, keeper, presend)
            span.set(
                "lastword.verdict", "interrupted" if isinstance(verdict, Next) else verdict.status
            )
        if isinstance(verdict, Next):
            return verdict
        if verdict.status in ("lost", "stale"):
            return self._not_sent(grant, keeper, reply, verdict)
        if verdict.forced:
            self.stats.forced += 1
            log.info("starvation guard: sending a reply for %s as it is", lease.conversation)
        return Written(reply, presend, forced=verdict.forced)

    def _not_sent(
        self, grant: Acquired, keeper: LeaseKeeper, reply: Reply, verdict: PreSend
    ) -> Next:
        """The pre-send check refused the reply: the lease is gone (`LeaseLost`), or newer
        messages came and the check released it (`Next`)."""
        if verdict.status == "lost":
            raise LeaseLost(grant.lease.conversation)
        keeper.released()
        if verdict.restarted:
            self.stats.restarted += 1
            self.stats.restarted_tokens += reply.spent
            return Next(verdict.look_in_ms, working=True)
        self.stats.discarded += 1
        self.stats.discarded_tokens += reply.spent
        log.info("discarded a stale reply for %s: new messages arrived", grant.lease.conversation)
        return Next(verdict.look_in_ms, working=True)

    async def _when_closed(
        self, grant: Acquired, keeper: LeaseKeeper, presend: Callable[[], Awaitable[PreSend]]
    ) -> PreSend | Next:
        """The pre-send check, once the burst's window has closed: a speculative reply (its
        lease taken with the window open) is held by the check until then, and waits here; a
        newer message meanwhile cuts the wait short as it would the generation (`Next`)."""
        for hold in range(HOLDS):
            verdict = await presend()
            if verdict.status != "hold":
                return verdict
            self.stats.held += hold == 0
            async with self._interruptible(grant, keeper) as race:
                waited = await race(asyncio.sleep((verdict.look_in_ms or 0) / 1000))
            if isinstance(waited, Next):
                if not self._restarted(grant.lease.conversation, race, 0):
                    self.stats.interrupted += 1
                return waited
        raise RuntimeError(f"the window of {grant.lease.conversation} is still open")

    async def _deliver(
        self,
        lease: Lease,
        text: str,
        version: int,
        sent_by: tuple[int, str],
        keeper: LeaseKeeper,
        grant: Acquired,
        slot: Slot | None = None,
    ) -> Outcome:
        """Send the reply (its first part in `slot`, if its turn was taken), and say what
        became of it. A transient failure propagates (the attempt is backed off and the
        outbox kept) until `SEND_ATTEMPTS` in a row."""
        try:
            burst = self.tracing.burst(grant.trace)
            await self._send(lease, text, version, sent_by, keeper, slot, replied(grant), burst)
        except LeaseLost:
            raise
        except Unreachable as exc:
            self.stats.unreachable += 1
            log.warning(
                "%s cannot be reached (%s): its messages count as answered, and it is marked "
                "until the user writes again",
                lease.conversation,
                exc,
            )
            return "unreachable"
        except Unavailable:
            # The platform out of reach, or refusing the bot's token for now: the reply
            # waits in the outbox however long that lasts, backed off across replicas.
            raise
        except Exception as exc:
            attempts = grant.failures + 1
            if not (isinstance(exc, SendFailed) and exc.permanent) and attempts < SEND_ATTEMPTS:
                raise
            self.stats.abandoned += 1
            log.error(
                "gave up the reply to %s (version %d) after %d attempts: %s",
                lease.conversation,
                version,
                attempts,
                exc,
            )
            return "abandoned"
        return "sent"

    async def _commit(self, lease: Lease, outcome: Outcome) -> Ended:
        """Commit: left undone, the reply already delivered would be sent again by the next
        holder. A refusal a retry outlives (`StoreUnavailable`) is retried, backed off, while
        the lease is ours (the keeper cancels this once it can no longer be confirmed). A
        failure no retry mends (a bug, a key damaged by hand) is logged once and counted, and
        the conversation moves on without the commit's history (`Store.settle`)."""
        try:
            ended = await self._outliving_refusals(lease, lambda: self.store.commit(lease, outcome))
        except (LeaseLost, StoreUnavailable):
            raise
        except Exception:
            self.stats.commits_failed += 1
            log.error(
                "commit of %s failed for good, after its reply was sent: its messages count as "
                "answered, and the history misses them and the reply",
                lease.conversation,
                exc_info=True,
            )
            ended = await self._outliving_refusals(lease, lambda: self.store.settle(lease))
        if not ended.ok:
            raise LeaseLost(lease.conversation)
        return ended

    async def _through_outage(self, lease: Lease, step: Callable[[], Awaitable[T]]) -> T:
        """`step()` (the pre-send check), made again, backed off, while the store is out of
        reach, for up to PRESEND_OUTAGE_S: a reply written just before a blip is checked once
        the store is back, not thrown away and generated again. The lease stays renewed
        meanwhile (its keeper cancels this once it can no longer be confirmed)."""
        backoff = Backoff(COMMIT_RETRY_S, COMMIT_RETRY_CAP_S, jitter=0.5)
        began = time.monotonic()
        while True:
            try:
                return await step()
            except StoreUnavailable as exc:
                if time.monotonic() - began >= PRESEND_OUTAGE_S:
                    raise
                delay = backoff.next_delay()
                log.info(
                    "the pre-send check of %s waits for the store (%s)", lease.conversation, exc
                )
                await asyncio.sleep(delay)

    async def _outliving_refusals(
        self, lease: Lease, step: Callable[[], Awaitable[Ended]]
    ) -> Ended:
        """`step()` (a commit, or its settling), made again after each refusal a retry
        outlives, backed off; whatever else it raises is raised."""
        backoff = Backoff(COMMIT_RETRY_S, COMMIT_RETRY_CAP_S)
        while True:
            try:
                return await step()
            except StoreUnavailable as exc:
                delay = backoff.next_delay()
                log.warning(
                    "commit of %s failed (%s); retrying in %.2fs", lease.conversation, exc, delay
                )
                await asyncio.sleep(delay)

    async def _reply_or_give_up(
        self, grant: Acquired, burst: Plan, keeper: LeaseKeeper, target: Retry | None
    ) -> Reply | Next:
        """`_reply`; or, once writing it has failed `llm.attempts` times in a row, the
        apology that ends the burst. An outage (the store, the platform) is not counted: it
        is backed off until it ends, as nothing could be delivered meanwhile anyway."""
        try:
            return await self._reply(grant, burst, keeper, target)
        except (LeaseLost, Unavailable):
            raise
        except Exception as exc:
            attempts = grant.failures + 1
            if attempts < self.settings.llm.attempts:
                raise
            return self._gave_up(grant, exc, attempts)

    def _gave_up(self, grant: Acquired, exc: Exception, attempts: int) -> Reply:
        self.stats.given_up += 1
        cause = cause_of(exc)
        log.error(
            "gave up writing the reply to %s (%d messages) after %d attempts; it gets an "
            "apology (%s): %s: %s",
            grant.lease.conversation,
            len(grant.unanswered),
            attempts,
            cause,
            type(exc).__name__,
            exc,
            exc_info=exc,
        )
        several = len(grant.unanswered) > 1
        return Reply(
            GAVE_UP.format(s="s" if several else "", them="them" if several else "it", cause=cause)
        )

    async def _reply(
        self, grant: Acquired, burst: Plan, keeper: LeaseKeeper, target: Retry | None
    ) -> Reply | Next:
        """The one reply to the burst: command answers first, then the model's answer to
        everything else (no model call when the burst is only commands, or its user is over
        the daily budget). `Next` instead if a newer message interrupted the generation."""
        conversation = grant.lease.conversation
        turn, answers = await self._commands(grant, burst)
        if not burst.for_model and target is None:
            return answers
        user = grant.unanswered[-1].user_id
        # At once: the person's memory is read beside their spending, not after it.
        spending, memory = await asyncio.gather(
            self.store.spending(conversation, user),
            remembered(self.memory, self.settings, conversation, user),
        )
        if not self.llm.calls_tools:
            memory = replace(memory, tools=Toolbox())
        budget = budget_of(self.settings, spending)
        if budget and spending.today >= budget:
            self.stats.over_budget += 1
            log.info("%s is over its daily token budget; no model call", conversation)
            return replace(answers, text=_joined(answers.text, OVER_BUDGET))
        # After a /reset or a /forget the model starts afresh: the history is about to go.
        keeps = burst.keeps_history and not answers.reset
        request = Request(
            conversation,
            burst.for_model,
            conversation_of(grant.history) if keeps else (),
            target,
            model_named(self.settings.llm, turn.model),
            turn.persona,
            grant.room,
            memory,
        )
        generation = await self._generation(grant, request, keeper)
        await self._account(conversation, user, generation)
        if generation.interrupted is not None:
            return generation.interrupted
        text = _joined(answers.text, generation.text)
        words = "" if generation.apology else generation.text
        return replace(
            answers, text=text, spent=generation.spent, tools=generation.tools, words=words
        )

    async def _commands(self, grant: Acquired, burst: Plan) -> tuple[CommandContext, Reply]:
        """The answers to the burst's commands, and the context they leave for the model's
        answer (a model or persona the burst picked)."""
        conversation = grant.lease.conversation
        turn = CommandContext(
            self.store,
            self.settings,
            conversation,
            picks_models=self.llm.picks_models,
            model=grant.model,
            persona=grant.persona,
            toolbox=self.toolbox,
            memory=self.memory if self.settings.memory.enabled else None,
        )
        answers: list[str] = []
        changes: list[Change] = []
        reset = 0
        for answer in burst.answers:
            if isinstance(answer, str):
                answers.append(answer)
                continue
            decision = await decide(turn, answer)
            answers.append(decision.answer)
            changes += decision.changes
            reset = answer.version if decision.reset else reset
        return turn, Reply("\n\n".join(answers), 0, tuple(changes), reset)

    async def _generation(
        self, grant: Acquired, request: Request, keeper: LeaseKeeper
    ) -> Generation:
        """The model's answer, with a live draft where the platform shows one; the apology if
        the model failed."""
        usage = Usage()
        # One draft id for every generation of this burst (its first version), so a
        # generation started after an interrupt replaces the old preview.
        draft_id = grant.watermark + 1
        # A speculative generation is not previewed while the user may still be typing.
        hold_until = grant.window.closes_at if grant.window is not None else None
        drafts = drafts_of(self.outbound)
        async with drafting(drafts, request.conversation, draft_id, hold_until) as drafter:
            if drafter is not None:
                usage.on_text = drafter.update
            generation = await self._generate(grant, request, usage, keeper)
        if drafter is not None:
            self.stats.drafts += drafter.sent
            if drafter.first_after_s is not None:
                self.stats.first_draft_seconds.observe(drafter.first_after_s)
        return generation

    async def _generate(
        self, grant: Acquired, request: Request, usage: Usage, keeper: LeaseKeeper
    ) -> Generation:
        """Read the burst's files, build the prompt and ask the model, all of it cancelled
        on the spot if a newer message arrives meanwhile (and interrupting is on)."""
        model = request.model
        user = grant.unanswered[-1].user_id
        # The tools as they are now, each call bound to one of these: a tool added or renamed
        # meanwhile changes nothing for this reply.
        offered = (
            *self.toolbox.offered(user in self.settings.access.admins),
            *(tool for tool, _ in request.memory.tools.tools.values()),
        )
        async with self._interruptible(grant, keeper) as race:
            prompt = await race(self._prompt(request, offered))
            if isinstance(prompt, Next):
                # Cut short while reading the files (a transcription, say): an interrupt too.
                generation = Generation("", None, usage, prompt, model)
                return self._interrupted(request, generation, race)
            began = time.monotonic()
            steps = self._steps(grant, request, race, usage, offered)
            try:
                done = await steps.answer(prompt, usage)
            except LLMError as exc:
                self._apologise(request, exc)
                return Generation(APOLOGY, prompt, usage, None, model, apology=True)
            finally:
                self.stats.tool_calls += steps.calls_run
                self.stats.tool_calls_reused += steps.calls_reused
        if isinstance(done, Next):
            return self._interrupted(request, Generation("", prompt, usage, done, model), race)
        self.stats.llm_seconds.observe(time.monotonic() - began)
        generation = Generation(done.text, prompt, usage, None, model, done.tools)
        self.stats.finished += 1
        self.stats.finished_tokens += generation.spent
        return generation

    def _steps(
        self, grant: Acquired, request: Request, race: Race, usage: Usage, offered: tuple[Tool, ...]
    ) -> Steps:
        """The reply's tool loop: the tools its user is offered, and the record of its turn
        (a /retry's: the turn of the reply it replaces, so its calls are not run again)."""
        llm = self.settings.llm
        return Steps(
            ModelUse(
                self.llm,
                llm,
                self.counter,
                llm.context_tokens - llm.max_tokens,
                self.tracing.burst(grant.trace),
                request.conversation,
                self.stats,
            ),
            ToolUse(self.settings.tools, self.toolbox, offered, request.memory.tools),
            TurnRecord(self.store, grant.lease, turn_of(grant, request.target), grant.version),
            race,
            on_text=usage.on_text,
        )

    def _apologise(self, request: Request, exc: LLMError) -> None:
        self.stats.apologies += 1
        # A refused key is logged once a minute where it is refused; not per burst.
        log.log(
            logging.WARNING if exc.kind == "key" else logging.ERROR,
            "LLM failed for %s (%d messages); sending an apology: %s",
            request.conversation,
            len(request.messages) + (len(request.target.asked) if request.target else 0),
            exc,
        )

    def _interrupted(self, request: Request, generation: Generation, race: Race) -> Generation:
        """Count and log a generation cut short by a newer message; it, as it was."""
        stats = self.stats
        spent = generation.spent
        if self._restarted(request.conversation, race, spent):
            return generation
        saved = max(stats.finished_tokens // stats.finished - spent, 0) if stats.finished else 0
        stats.interrupted += 1
        stats.interrupted_tokens += spent
        stats.saved_tokens += saved
        log.info(
            "interrupted the generation for %s after %d tokens (about %d saved): "
            "a newer message arrived",
            request.conversation,
            spent,
            saved,
        )
        return generation

    def _restarted(self, conversation: str, race: Race, spent: int) -> bool:
        """Count a speculative generation (or its wait for the window) cut short by a message of
        its own burst, if it was one (True); False for an interrupt proper."""
        if not race.restarted:
            return False
        self.stats.restarted += 1
        self.stats.restarted_tokens += spent
        log.debug("restarted the speculative generation for %s: the user wrote on", conversation)
        return True

    async def _prompt(self, request: Request, offered: tuple[Tool, ...]) -> Prompt:
        """The prompt within the context, the schemas of the `offered` tools counted in."""
        llm = self.settings.llm
        schemas = (
            self.counter.count(json.dumps([tool.spec() for tool in offered])) if offered else 0
        )
        conversation = request.conversation
        history = request.history
        system = system_prompt(llm.system_prompt)
        if request.memory.on:
            # Before the persona: the user's own instructions come after the operator's.
            system += "\n\n" + MEMORY_NOTE
        system = with_persona(system, request.persona)
        system = in_room(system, conversation, request.messages)
        prepared = await self.media.prepare(conversation, request.messages)
        if prepared.unseen:
            system += "\n\n" + UNSEEN_NOTE
        texts, images = list(prepared.texts), list(prepared.images)
        if request.target is not None:
            # /retry: the messages the last reply answered are asked again, with the history
            # as it was before them.
            history = request.target.before
            asked = [t.text for t in await self.media.history(conversation, request.target.asked)]
            texts = asked + texts
            images = [()] * len(asked) + images if images else []
        turns = await self.media.history(conversation, history)
        # The memory tool's results are lastword's own words; any other tool's are data.
        theirs = [tool for tool in offered if not request.memory.tools.get(tool.name)]
        if theirs or any(turn.used for turn in turns):
            system += "\n\n" + TOOL_DATA
        prompt = fit(
            system,
            turns,
            texts,
            llm.context_tokens - llm.max_tokens - schemas,
            self.counter,
            images,
            Others.of(request.messages, request.room),
            fact_lines(request.memory.facts),
        )
        return prompt if request.model is None else replace(prompt, model=request.model.model)

    @contextlib.asynccontextmanager
    async def _interruptible(
        self, grant: Acquired, keeper: LeaseKeeper, *, follow: bool = True, waiting: bool = False
    ) -> AsyncIterator[Race]:
        """What runs the generation's steps: each is cancelled if a newer message arrives
        meanwhile, the lease handed back, and `Next` returned instead of its result. Not if
        `follow` is false (the reply goes out whatever comes). `waiting`: the step is a wait
        that costs nothing (a turn in the outbound budget), so the version is read less often
        (`VersionWatch`)."""
        race = Race(grant.lease, keeper, self.store)
        # At the starvation limit the pre-send check forces this reply out whatever arrives,
        # so it is not worth interrupting.
        if not follow or not self.settings.llm.interrupt or self._starved(grant):
            yield race
            return
        conversation = grant.lease.conversation
        moved = self.watch.watch(
            conversation, grant.version, grant.lease.fence, race.cut, waiting=waiting
        )
        race.follow(moved)
        try:
            yield race
        finally:
            self.watch.unwatch(conversation, moved)
            if race.newer is not None:
                await cancel_and_wait(race.newer)

    def _starved(self, grant: Acquired) -> bool:
        """Whether the pre-send check will send this reply whatever arrives meanwhile."""
        age = self.settings.starvation_age_ms
        by_age = age > 0 and grant.waited_ms >= age
        return by_age or grant.discards >= self.settings.starvation_limit

    async def _account(self, conversation: str, user: str, generation: Generation) -> None:
        """Count what the generation cost, in Redis, and learn from the provider's own count.
        Best effort: a store hiccup must not cost the reply."""
        usage, prompt = generation.usage, generation.prompt
        if not usage.attempts or prompt is None:
            return  # interrupted while its files were read: no request was made
        estimated = estimated_tokens(prompt, self.counter)
        reported = [a for a in usage.attempts if a.reported]
        if len(usage.attempts) == 1 and reported:
            self.counter.learn(estimated, reported[0].prompt_tokens)
        prompt_tokens, completion_tokens = usage.totals(estimated)
        self.stats.prompt_tokens += prompt_tokens
        self.stats.completion_tokens += completion_tokens
        cost = generation.model.cost if generation.model else 1.0
        try:
            today = await self.store.add_usage(
                conversation, user, prompt_tokens, completion_tokens, cost
            )
        except StoreUnavailable as exc:
            log.warning("could not count the tokens of %s: %s", conversation, exc)
        else:
            log.info(
                "tokens for %s: prompt %d, completion %d%s; its user's today: %d",
                conversation,
                prompt_tokens,
                completion_tokens,
                "" if all(a.reported for a in usage.attempts) else " (partly estimated)",
                today,
            )

    async def _send(
        self,
        lease: Lease,
        text: str,
        version: int,
        sent_by: tuple[int, str],
        keeper: LeaseKeeper,
        slot: Slot | None,
        reply_to: str | None,
        burst: Burst = NO_BURST,
    ) -> None:
        try:
            for index, part in enumerate(split_message(text, self.outbound.max_message_chars)):
                await keeper.ensure_fresh()
                key = idempotency_key(lease.conversation, version, index, *sent_by)
                # The send records the slot's use, whatever becomes of it.
                given, slot = slot, None
                with burst.span("send part") as span:
                    span.set("lastword.part", index)
                    await self.outbound.send(
                        lease.conversation, part, key, slot=given, reply_to=reply_to
                    )
                reply_to = None
                self.stats.parts += 1
        finally:
            if slot is not None:
                # Granted, never used (the lease lost first): given back now, not left in
                # flight, where its replica would keep it (and its chat's turn) for 30 s.
                await self.outbound.give_back(slot)
