"""The configuration: the settings schema (`settings`), the names nobody reads (`spelling`),
credentials a service refused (`credentials`), and `lastword settings`' table (`settings_list`).
It imports only the ground floor: every layer above reads settings, none is read here.
"""

__all__ = ["credentials", "settings", "settings_list", "spelling"]
