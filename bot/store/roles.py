"""Roles: exclusive, expiring leases on jobs shared by all replicas (such as the one Telegram
poller), with a fence that only goes up."""

from __future__ import annotations

from bot.store.calls import Calls
from bot.store.keys import ROLE_TAG, role_key


class Roles(Calls):
    """Claim, renew and give back a role."""

    async def claim_role(self, name: str, token: str, ttl_ms: int) -> int | None:
        """Take the role `name` for `ttl_ms`. Returns its fence if it is now ours (newly
        taken, with a fence higher than any before, or already ours and renewed), None if
        another holder has it."""
        keys = [role_key(name), ROLE_TAG]
        fence = int(await self._run(self._role, keys, ["claim", name, token, "", ttl_ms]))
        return fence or None

    async def renew_role(self, name: str, token: str, fence: int, ttl_ms: int) -> bool:
        """Extend our hold on a role by `ttl_ms`; False if it is no longer ours."""
        keys = [role_key(name), ROLE_TAG]
        return bool(await self._run(self._role, keys, ["renew", name, token, fence, ttl_ms]))

    async def release_role(self, name: str, token: str) -> bool:
        """Give the role back if it is still ours; False (and no change) otherwise."""
        return bool(await self._run(self._role_release, [role_key(name)], [token]))
