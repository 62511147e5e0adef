"""One cycle: lease, check, generate once, pre-send check, send, commit (SPEC, steps 2-7).

A cycle runs on whichever replica wins the lease. Everything it needs comes from the store
when the lease is taken, so any replica can finish any conversation. While it works, a
keeper (`bot.lease`) renews the lease every TTL/3; once it is lost, the work is cancelled on
the spot.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import traceback
from collections import deque
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from bot import admin
from bot.backoff import Backoff
from bot.cancel import cancel_and_wait
from bot.commands import (
    ADMIN_COMMANDS,
    ECHO_MODEL_ANSWER,
    NOTHING_TO_RETRY,
    OVER_BUDGET,
    Ask,
    Plan,
    model_named,
    models_answer,
    plan,
    usage_answer,
)
from bot.drafts import drafting, drafts_of
from bot.lease import LeaseKeeper, LeaseLost
from bot.llm import LLM, LLMError, Usage, generate
from bot.media import UNSEEN_NOTE, Media
from bot.message import Outbound, SendFailed, Unavailable, Unreachable
from bot.prompt import Prompt, estimated_tokens, fit, system_prompt
from bot.settings import ModelChoice, Settings
from bot.split import split_message
from bot.store import (
    RETRY_AFTER_ERROR_MS,
    Ended,
    Grant,
    HistoryEntry,
    Lease,
    Outcome,
    Spending,
    Store,
    StoreUnavailable,
    lease_token,
)
from bot.tokens import Counter
from bot.transcribe import Transcriber
from bot.watch import VersionWatch

log = logging.getLogger(__name__)

APOLOGY = "Sorry, I can't answer right now because of a technical problem. Please try again later."
# The reply to a burst whose reply failed `llm.attempts` times in a row: what went wrong, in
# the user's words, so that the conversation moves on (the burst counts as answered).
GAVE_UP = (
    "Sorry, I couldn't answer your last message{s}: {cause}. I've set {them} aside, so "
    "anything you write now gets a fresh answer."
)
# What went wrong, by the module the error came from; the log has the details.
CAUSES = (
    ("bot.media", "one of the files you sent could not be read"),
    ("bot.transcribe", "a voice note could not be transcribed"),
    ("bot.llm", "the AI service sent an answer I could not read"),
    ("openai", "the AI service sent an answer I could not read"),
    ("bot.admin", "a command could not be carried out"),
    ("bot.commands", "a command could not be carried out"),
)
CAUSE = "something went wrong on my side"

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


def _budget(settings: Settings, spending: Spending) -> int:
    """A user's daily token budget: the one an admin set for them, else the settings'."""
    return settings.llm.daily_tokens_per_user if spending.budget is None else spending.budget


def idempotency_key(conversation: str, version: int, index: int, fence: int, token: str) -> str:
    """The idempotency key (Discord: hashed into the nonce) of reply part `index`: the same for
    the same part re-sent from the outbox, new for any other reply. Besides the version it
    names the lease that passed the pre-send check, by its fence and the random part of its
    token: a store that lost its last writes in a crash (LASTWORD_DURABILITY=fast) hands out
    the same version again, and the same fence, but never the same token."""
    salt = token.rpartition("/")[2][:KEY_SALT_CHARS]
    return f"{conversation}:{version}:{index}:{fence}:{salt}"


@dataclass(frozen=True)
class Retry:
    """What a /retry writes again: the last reply (its version), the user's messages it
    answered, and the history before them."""

    before: tuple[HistoryEntry, ...]
    asked: tuple[HistoryEntry, ...]
    version: int


def last_reply(history: Sequence[HistoryEntry]) -> Retry | None:
    """The last reply in the history and what it answered; None if there is none."""
    replies = [i for i, entry in enumerate(history) if entry.role == "assistant"]
    if not replies:
        return None
    last = replies[-1]
    first = replies[-2] + 1 if len(replies) > 1 else 0
    asked = tuple(e for e in history[first:last] if e.role == "user")
    if not asked:
        return None
    return Retry(tuple(history[:first]), asked, history[last].version)


@dataclass(frozen=True)
class Reply:
    """The one reply to a burst: its text, the completion tokens it cost, and the admin
    changes it announces (carried out once it passes the pre-send check)."""

    text: str
    spent: int = 0
    changes: tuple[admin.Change, ...] = ()


def cause_of(exc: BaseException) -> str:
    """What went wrong, for the user: where the error was raised, in plain words."""
    modules = [
        frame.f_globals.get("__name__", "") for frame, _ in traceback.walk_tb(exc.__traceback__)
    ]
    for module in reversed(modules):
        for prefix, words in CAUSES:
            if module == prefix or module.startswith(prefix + "."):
                return words
    return CAUSE


@dataclass(frozen=True)
class Next:
    """When to look at the conversation again (None: nothing owed, or another replica's), and
    whether this replica is still the one working towards its reply (so it shows typing)."""

    look_in_ms: int | None
    working: bool


NOTHING = Next(None, working=False)


@dataclass
class Buckets:
    """A histogram kept as cumulative bucket counts, the shape Prometheus exposes."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.bounds)

    def observe(self, value: float) -> None:
        self.total += value
        self.count += 1
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1


@dataclass
class Stats:
    """Counters a replica keeps about its own work, for metrics, logs, benchmarks and tests."""

    # Intake (counted by the runtime): messages taken in, dropped as redeliveries, dropped by
    # the rate limit, refused by the allow-list; windows opened, and messages that found
    # their window at its hard cap.
    ingested: int = 0
    duplicates: int = 0
    rate_limited: int = 0
    refused: int = 0
    windows_opened: int = 0
    windows_capped: int = 0
    # Cycles that took the lease; wake-ups with nothing owed (no-op) or not yet due / held
    # elsewhere (deferred).
    cycles: int = 0
    noop: int = 0
    deferred: int = 0
    replies: int = 0
    parts: int = 0
    renewal_failures: int = 0
    discarded: int = 0
    forced: int = 0
    apologies: int = 0
    # Bursts answered with an apology because their reply failed `llm.attempts` times.
    given_up: int = 0
    resent: int = 0
    lost: int = 0
    # Attempts that failed (a platform or store error) and were handed back, backed off;
    # replies given up after a permanent error or too many failures; replies to users who
    # cannot be reached (they blocked the bot, or closed their DMs).
    failed: int = 0
    abandoned: int = 0
    unreachable: int = 0
    # Generations cancelled because a newer message arrived, and the tokens they had
    # streamed by then; tokens of finished replies thrown away by the pre-send check.
    interrupted: int = 0
    interrupted_tokens: int = 0
    discarded_tokens: int = 0
    # What the interrupts saved, estimated: a cancelled generation would likely have gone on
    # to the mean length of the finished ones (0 until one has finished).
    saved_tokens: int = 0
    finished: int = 0
    finished_tokens: int = 0
    over_budget: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # The most recent wake-up latenesses; bounded so a long-running replica does not grow.
    lateness_ms: deque[int] = field(default_factory=lambda: deque(maxlen=10_000))
    lateness: Buckets = field(
        default_factory=lambda: Buckets((5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000))
    )
    # Live drafts shown (where the platform has them), and how long after the generation
    # started the first one was.
    drafts: int = 0
    first_draft_seconds: Buckets = field(
        default_factory=lambda: Buckets((0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8))
    )
    # Seconds from the request to the answer, for generations that finished.
    llm_seconds: Buckets = field(
        default_factory=lambda: Buckets((0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128))
    )


class Cycle:
    def __init__(
        self,
        settings: Settings,
        store: Store,
        llm: LLM,
        outbound: Outbound,
        transcriber: Transcriber | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.llm = llm
        self.outbound = outbound
        self.stats = Stats()
        self.counter = Counter()
        self.watch = VersionWatch(store, settings.llm.interrupt_poll_ms / 1000)
        self.media = Media(
            settings.media,
            settings.llm.model,
            outbound,
            store,
            transcriber,
            can_see=llm.name != "echo",
        )

    def configure(self, settings: Settings) -> None:
        """Take on reloaded settings, the model's with them. The version watch keeps its
        interval (`llm.interrupt_poll_ms` needs a restart)."""
        self.settings = settings
        self.llm.configure(settings.llm)
        self.media.configure(settings.media, settings.llm.model, can_see=self.llm.name != "echo")

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
        if grant.status == "early":
            self.stats.deferred += 1
            return Next(grant.look_in_ms, working=True)
        if grant.status in ("busy", "backoff"):
            self.stats.deferred += 1
            # Another replica holds it and shows typing, or a failed attempt is backed off:
            # look again then.
            return Next(grant.look_in_ms, working=False)
        if grant.lease is None:
            self.stats.noop += 1
            return NOTHING
        lease = grant.lease
        self.stats.cycles += 1
        keeper = LeaseKeeper(
            f"lease on {conversation}",
            functools.partial(self.store.renew, lease),
            self.store.settings.ttl_ms,
            confirmed_at=sent_at,
            on_failure=self._renewal_failed,
        )
        try:
            return await keeper.run(self._work(grant, keeper, sent_at))
        except LeaseLost:
            self.stats.lost += 1
            log.warning("lost the lease on %s mid-cycle; nothing sent from here", conversation)
            return NOTHING
        except Exception as exc:
            # A failed attempt (a platform or store error, a bug): hand the conversation back
            # with the next attempt backed off, whichever replica makes it.
            self.stats.failed += 1
            if isinstance(exc, Unavailable):
                log.warning("cycle for %s failed: %s", conversation, exc)
            else:
                # A warning with its traceback: after `llm.attempts` in a row the burst is
                # answered with an apology, logged once at ERROR (`_gave_up`).
                log.warning("cycle for %s failed; trying again", conversation, exc_info=True)
            return await self._back_off(lease)
        except BaseException:
            # Shutdown: hand the conversation back now rather than after the TTL.
            await self._await_hand_back(lease)
            raise

    def _renewal_failed(self) -> None:
        self.stats.renewal_failures += 1

    def _hand_back(self, lease: Lease, *, failed: bool = False) -> asyncio.Future[Ended]:
        """Release the lease in a task of its own, so that it completes even if the caller is
        cancelled meanwhile. Token-checked: it can never free someone else's lease."""
        release = asyncio.ensure_future(self.store.release(lease, failed=failed))
        # Collect its outcome whoever waits for it, or nobody.
        release.add_done_callback(lambda t: t.cancelled() or t.exception())
        return release

    async def _await_hand_back(self, lease: Lease) -> None:
        with contextlib.suppress(Exception):
            await asyncio.shield(self._hand_back(lease))

    async def _back_off(self, lease: Lease) -> Next:
        try:
            ended = await asyncio.shield(self._hand_back(lease, failed=True))
        except Exception as exc:
            # The store is out of reach too: the lease expires on its own, and the due-index
            # still holds the conversation for the sweep.
            log.warning("could not hand %s back: %s", lease.conversation, exc)
            return Next(RETRY_AFTER_ERROR_MS, working=False)
        return Next(ended.look_in_ms, working=False)

    async def _work(self, grant: Grant, keeper: LeaseKeeper, began: float) -> Next:
        assert grant.lease is not None
        lease = grant.lease
        if grant.resend is not None:
            # A holder crashed after its pre-send check: send the same text again, never a
            # freshly generated one (SPEC step 8). First make sure the lease is still ours: a
            # pause after the acquire may have let another replica resend and commit it.
            await keeper.ensure_fresh(always=True)
            text, version = grant.resend
            self.stats.resent += 1
            log.info("resending the reply left in the outbox of %s", lease.conversation)
            # The admin changes it announces: applied again, as its holder may have died first.
            await admin.apply(self.store, admin.decoded(grant.resend_changes))
        else:
            self.stats.lateness_ms.append(grant.lateness_ms)
            self.stats.lateness.observe(grant.lateness_ms)
            version = grant.version
            burst = plan(grant.watermark, grant.unanswered, self.settings.access.admins)
            target = last_reply(grant.history) if burst.retry and burst.keeps_history else None
            if burst.retry and target is None:
                burst = replace(burst, answers=(*burst.answers, NOTHING_TO_RETRY))
            reply = await self._reply_or_give_up(grant, burst, keeper, target)
            if isinstance(reply, Next):
                return reply
            text, spent = reply.text, reply.spent
            verdict = await self.store.presend(
                lease,
                version,
                text,
                reset=burst.reset,
                replaces=target.version if target else 0,
                unsaid=burst.retry,
                changes=admin.encoded(reply.changes),
                worked_ms=int((time.monotonic() - began) * 1000),
            )
            if verdict.status == "lost":
                raise LeaseLost(lease.conversation)
            if verdict.status == "stale":
                keeper.released()
                self.stats.discarded += 1
                self.stats.discarded_tokens += spent
                log.info("discarded a stale reply for %s: new messages arrived", lease.conversation)
                return Next(verdict.look_in_ms, working=True)
            if verdict.forced:
                self.stats.forced += 1
                log.info("starvation guard: sending a reply for %s as it is", lease.conversation)
            # Only now, past the final check: a stale reply's commands change nothing.
            await admin.apply(self.store, reply.changes)
        # Whose pre-send check the reply passed: this lease's, or for a resend the crashed one's.
        sent_by = grant.resend_lease if grant.resend is not None else (lease.fence, lease.token)
        outcome = await self._deliver(lease, text, version, sent_by, keeper, grant.failures)
        ended = await self._commit(lease, outcome)
        if outcome == "sent":
            self.stats.replies += 1
        return Next(ended.look_in_ms, working=ended.look_in_ms is not None)

    async def _deliver(
        self,
        lease: Lease,
        text: str,
        version: int,
        sent_by: tuple[int, str],
        keeper: LeaseKeeper,
        failures: int,
    ) -> Outcome:
        """Send the reply, and say what became of it. A transient failure propagates (the
        attempt is backed off and the outbox kept) until `SEND_ATTEMPTS` in a row."""
        try:
            await self._send(lease, text, version, sent_by, keeper)
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
            attempts = failures + 1
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
        """Commit, retrying any failure while the lease is ours: left undone, the reply
        already delivered would be sent again by the next holder. The keeper cancels this
        once the lease can no longer be confirmed."""
        backoff = Backoff(COMMIT_RETRY_S, COMMIT_RETRY_CAP_S)
        while True:
            try:
                ended = await self.store.commit(lease, outcome)
            except LeaseLost:
                raise
            except Exception as exc:
                # A refusal a retry outlives (StoreUnavailable), or one we did not foresee:
                # either way, giving up here would send the reply twice.
                delay = backoff.next_delay()
                log.warning(
                    "commit of %s failed (%s); retrying in %.2fs",
                    lease.conversation,
                    exc if isinstance(exc, StoreUnavailable) else f"{type(exc).__name__}: {exc}",
                    delay,
                )
                await asyncio.sleep(delay)
                continue
            if not ended.ok:
                raise LeaseLost(lease.conversation)
            return ended

    async def _reply_or_give_up(
        self, grant: Grant, burst: Plan, keeper: LeaseKeeper, target: Retry | None
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

    def _gave_up(self, grant: Grant, exc: Exception, attempts: int) -> Reply:
        assert grant.lease is not None
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
        self, grant: Grant, burst: Plan, keeper: LeaseKeeper, target: Retry | None
    ) -> Reply | Next:
        """The one reply to the burst and the completion tokens it cost: command answers
        first, then the model's answer to everything else (no model call when the burst is
        only commands, or its user is over the daily budget). `Next` instead if a newer
        message interrupted the generation."""
        assert grant.lease is not None
        conversation = grant.lease.conversation
        # The model in effect: the user's pick, or one this very burst picks.
        picked = [grant.model]
        decided = [await self._looked_up(conversation, a, picked) for a in burst.answers]
        answers = [d.answer for d in decided]
        changes = tuple(c for d in decided for c in d.changes)
        choice = model_named(self.settings.llm, picked[-1])
        if not burst.for_model and target is None:
            return Reply("\n\n".join(answers), 0, changes)
        user = grant.unanswered[-1].user_id
        spending = await self.store.spending(conversation, user)
        budget = _budget(self.settings, spending)
        if budget and spending.today >= budget:
            self.stats.over_budget += 1
            log.info("%s is over its daily token budget; no model call", conversation)
            return Reply("\n\n".join((*answers, OVER_BUDGET)), 0, changes)
        usage = Usage()
        # Filled once the prompt is built: the files are read inside the interruptible part.
        prompts: list[Prompt] = []
        began = time.monotonic()
        answered = False
        try:
            # One draft id for every generation of this burst (its first version), so a
            # generation started after an interrupt replaces the old preview.
            draft_id = grant.watermark + 1
            async with drafting(drafts_of(self.outbound), conversation, draft_id) as drafter:
                if drafter is not None:
                    usage.on_text = drafter.update
                outcome = await self._generate(
                    grant, self._answer(grant, burst, usage, prompts, choice, target), keeper
                )
            if drafter is not None:
                self.stats.drafts += drafter.sent
                if drafter.first_after_s is not None:
                    self.stats.first_draft_seconds.observe(drafter.first_after_s)
            if not isinstance(outcome, Next):
                answered = True
                self.stats.llm_seconds.observe(time.monotonic() - began)
        except LLMError as exc:
            self.stats.apologies += 1
            # A refused key is logged once a minute where it is refused; not per burst.
            log.log(
                logging.WARNING if exc.kind == "key" else logging.ERROR,
                "LLM failed for %s (%d messages); sending an apology: %s",
                conversation,
                len(burst.for_model) + (len(target.asked) if target else 0),
                exc,
            )
            outcome = APOLOGY
        cost = choice.cost if choice else 1.0
        spent = await self._account(conversation, user, prompts, usage, cost)
        stats = self.stats
        if isinstance(outcome, Next):
            saved = max(stats.finished_tokens // stats.finished - spent, 0) if stats.finished else 0
            stats.interrupted += 1
            stats.interrupted_tokens += spent
            stats.saved_tokens += saved
            log.info(
                "interrupted the generation for %s after %d tokens (about %d saved): "
                "a newer message arrived",
                conversation,
                spent,
                saved,
            )
            return outcome
        if answered:
            stats.finished += 1
            stats.finished_tokens += spent
        return Reply("\n\n".join((*answers, outcome)), spent, changes)

    async def _looked_up(
        self, conversation: str, answer: str | Ask, picked: list[str]
    ) -> admin.Decision:
        """A command's answer, with what it needs from the store. A model picked is kept
        for every replica at once, and appended to `picked` for the rest of the burst."""
        llm = self.settings.llm
        if isinstance(answer, str):
            return admin.Decision(answer)
        if answer.command in ADMIN_COMMANDS:
            return await admin.decide(self.store, self.settings, answer)
        if answer.command == "usage":
            spending = await self.store.spending(conversation, answer.by)
            budget = _budget(self.settings, spending)
            return admin.Decision(usage_answer(spending.today, spending.month, budget))
        if self.llm.name == "echo":
            return admin.Decision(ECHO_MODEL_ANSWER)
        if not answer.argument:
            return admin.Decision(models_answer(llm, picked[-1]))
        choice = model_named(llm, answer.argument)
        if choice is None:
            return admin.Decision(
                f"There is no model called {answer.argument!r}.\n" + models_answer(llm, picked[-1])
            )
        await self.store.pick_model(conversation, choice.name)
        picked.append(choice.name)
        return admin.Decision(f"From now on I answer you with {choice.name} ({choice.model}).")

    async def _answer(
        self,
        grant: Grant,
        burst: Plan,
        usage: Usage,
        prompts: list[Prompt],
        choice: ModelChoice | None,
        target: Retry | None,
    ) -> str:
        """Read the burst's files, build the prompt, and ask the model."""
        assert grant.lease is not None
        prompt = await self._prompt(grant.lease.conversation, grant, burst, target)
        if choice is not None:
            prompt = replace(prompt, model=choice.model)
        prompts.append(prompt)
        return await generate(self.llm, prompt, self.settings.llm, usage)

    async def _prompt(
        self, conversation: str, grant: Grant, burst: Plan, target: Retry | None
    ) -> Prompt:
        llm = self.settings.llm
        # After a /reset the model starts afresh: the old history is about to be emptied.
        history = grant.history if burst.keeps_history else ()
        system = system_prompt(llm.system_prompt)
        said = await self.media.prepare(conversation, burst.for_model)
        if said.unseen:
            system += "\n\n" + UNSEEN_NOTE
        texts, images = list(said.texts), list(said.images)
        if target is not None:
            # /retry: the messages the last reply answered are asked again, with the history
            # as it was before them.
            history = target.before
            asked = [t.text for t in await self.media.history(conversation, target.asked)]
            texts = asked + texts
            images = [()] * len(asked) + images if images else []
        return fit(
            system,
            await self.media.history(conversation, history),
            texts,
            llm.context_tokens - llm.max_tokens,
            self.counter,
            images,
        )

    async def _generate(
        self, grant: Grant, answer: Coroutine[Any, Any, str], keeper: LeaseKeeper
    ) -> str | Next:
        """The model's answer, its files read first; or, if a newer message arrives meanwhile
        (and interrupting is on), `Next`: the work was cancelled on the spot and the lease
        handed back."""
        assert grant.lease is not None
        lease = grant.lease
        generation = asyncio.ensure_future(answer)
        # At the starvation limit the pre-send check forces this reply out whatever arrives,
        # so it is not worth interrupting.
        if not self.settings.llm.interrupt or self._starved(grant):
            try:
                return await generation
            finally:
                await cancel_and_wait(generation)
        moved = self.watch.watch(lease.conversation, grant.version)
        newer = asyncio.ensure_future(moved.wait())
        try:
            await asyncio.wait({generation, newer}, return_when=asyncio.FIRST_COMPLETED)
            if generation.done():
                # The answer came first, or with the news: the pre-send check decides.
                return generation.result()
            # Stop paying for tokens before anything else: cancelling closes the provider's
            # stream. The lease goes back while the cancellation unwinds. (If Redis is out of
            # reach just now, StoreUnavailable ends the cycle as any store failure does: the
            # generation is gone either way, and the lease is released or expires.)
            generation.cancel()
            verdict = await self.store.interrupt(lease)
        finally:
            self.watch.unwatch(lease.conversation, moved)
            await cancel_and_wait(newer)
            await cancel_and_wait(generation)
        if verdict.status == "lost":
            raise LeaseLost(lease.conversation)
        keeper.released()
        return Next(verdict.look_in_ms, working=True)

    def _starved(self, grant: Grant) -> bool:
        """Whether the pre-send check will send this reply whatever arrives meanwhile."""
        age = self.settings.starvation_age_ms
        by_age = age > 0 and grant.waited_ms >= age
        return by_age or grant.discards >= self.settings.starvation_limit

    async def _account(
        self, conversation: str, user: str, prompts: list[Prompt], usage: Usage, cost: float
    ) -> int:
        """Count what the generation cost, in Redis, and learn from the provider's own count.
        Returns its completion tokens. Best effort: a store hiccup must not cost the reply."""
        if not usage.attempts:
            return 0  # interrupted while its files were read: no request was made
        estimated = estimated_tokens(prompts[0], self.counter)
        reported = [a for a in usage.attempts if a.reported]
        if len(usage.attempts) == 1 and reported:
            self.counter.learn(estimated, reported[0].prompt_tokens)
        prompt_tokens, completion_tokens = usage.totals(estimated)
        self.stats.prompt_tokens += prompt_tokens
        self.stats.completion_tokens += completion_tokens
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
        return completion_tokens

    async def _send(
        self,
        lease: Lease,
        text: str,
        version: int,
        sent_by: tuple[int, str],
        keeper: LeaseKeeper,
    ) -> None:
        for index, part in enumerate(split_message(text, self.outbound.max_message_chars)):
            await keeper.ensure_fresh()
            key = idempotency_key(lease.conversation, version, index, *sent_by)
            await self.outbound.send(lease.conversation, part, key)
            self.stats.parts += 1
