"""Roles: exclusive, expiring leases on jobs shared by all replicas (such as the one Telegram
poller), with a fence that only goes up."""

from __future__ import annotations

from bot.store import scripts
from bot.store.calls import Calls
from bot.store.keys import ROLE_TAG, role_key


class Roles(Calls):
    """Claim, renew and give back a role."""

    async def claim_role(self, name: str, token: str, ttl_ms: int) -> int | None:
        """Take the role `name` for `ttl_ms`. Returns its fence if it is now ours (newly
        taken, with a fence higher than any before, or already ours and renewed), None if
        another holder has it."""
        args: dict[str, str | int] = {
            "mode": "claim",
            "name": name,
            "token": token,
            "fence": "",
            "ttl_ms": ttl_ms,
        }
        fence = int(await self._run(scripts.ROLE, _keys(name), args))
        return fence or None

    async def renew_role(self, name: str, token: str, fence: int, ttl_ms: int) -> bool:
        """Extend our hold on a role by `ttl_ms`; False if it is no longer ours."""
        args: dict[str, str | int] = {
            "mode": "renew",
            "name": name,
            "token": token,
            "fence": fence,
            "ttl_ms": ttl_ms,
        }
        return bool(await self._run(scripts.ROLE, _keys(name), args))

    async def release_role(self, name: str, token: str) -> bool:
        """Give the role back if it is still ours; False (and no change) otherwise."""
        keys = {"role": role_key(name)}
        return bool(await self._run(scripts.ROLE_RELEASE, keys, {"token": token}))


def _keys(name: str) -> dict[str, str]:
    """role.lua's keys for the role `name`."""
    return {"role": role_key(name), "fences": ROLE_TAG}
