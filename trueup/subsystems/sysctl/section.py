"""`spec.sysctl`: kernel parameter name → value (pure data; errors name the path).

```yaml
spec:
  sysctl:
    net.ipv4.ip_forward: 1
    net.ipv6.conf.all.forwarding: 1
```
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, RootModel

from trueup.model.sections import Section

__all__ = ["SECTION", "SysctlSection"]

_NAME = re.compile(r"^[a-z0-9_]+(\.[A-Za-z0-9_\-]+)+$")


def _name(value: str) -> str:
    if not _NAME.match(value):
        raise ValueError(f"{value!r} is not a sysctl name like net.ipv4.ip_forward")
    return value


def _value(value: str | int) -> str:
    text = " ".join(str(value).split())
    if not text:
        raise ValueError("empty sysctl value")
    return text


SysctlName = Annotated[str, AfterValidator(_name)]
SysctlValue = Annotated[str | int, AfterValidator(_value)]


class SysctlSection(RootModel[dict[SysctlName, SysctlValue]]):
    """`spec.sysctl`: sysctl name → value (numbers or strings; whitespace normalised)."""


SECTION = Section("sysctl", SysctlSection)
