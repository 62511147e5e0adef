"""A credential a service refuses while the bot runs (a revoked token, a key gone bad): the
state `/healthz` reports, and the one log line a minute an operator needs to see it.

Whoever holds the credential (an adapter, the LLM client, the transcriber) tells its
`Credential` each time the service refuses or accepts it. The refusal is logged at ERROR,
without a traceback, at most once per `REPORT_EVERY_S`: a bot that retries a refused token
every few seconds must not fill the journal with the same news.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger(__name__)

# A refusal that lasts is logged again this often, never more.
REPORT_EVERY_S = 60.0


class Credential:
    """One setting's credential as `service` sees it: refused (with the reason) or not.
    `configured` False: the setting is empty, so a refusal means the service wants one."""

    def __init__(self, setting: str, service: str, *, configured: bool = True) -> None:
        self.setting = setting
        self.service = service
        self.configured = configured
        self._reason: str | None = None
        self._reported_at: float | None = None

    @property
    def reason(self) -> str | None:
        """Why the service refuses the credential right now, naming the setting; None while
        it is accepted (or was never tried)."""
        return self._reason

    def refused(self, how: str, fix: str, *, level: int = logging.ERROR) -> None:
        """The service refused the credential: `how` says where ("getUpdates at <url>"),
        `fix` what to do. Logged at `level` unless it was within the last minute."""
        if self.configured:
            self._reason = f"{self.service} refused {self.setting}"
        else:
            self._reason = f"{self.service} wants a key: {self.setting} is not set"
        now = time.monotonic()
        if self._reported_at is not None and now - self._reported_at < REPORT_EVERY_S:
            return
        self._reported_at = now
        log.log(level, "%s (%s): %s", self._reason, how, fix)

    def accepted(self) -> None:
        """The service took the credential: a refusal, if any, is over."""
        if self._reason is None:
            return
        log.warning("%s accepts %s again", self.service, self.setting)
        self._reason = None
        self._reported_at = None
