"""Long-context ops (each beside a plain reference: `naive.py` or upstream's forward), installed over an
upstream module by `Cls.install(module, **settings)`. `swap_class` is the one place that sets
`module.__class__`: the object itself stays (parent reference, parameters, hooks), as `fully_shard` does."""

from __future__ import annotations

from typing import Any

from torch import nn


def swap_class(module: nn.Module, cls: type) -> nn.Module:
    """Make `module` an instance of `cls`, a subclass of its class, in place; returns it."""
    module.__class__ = cls
    return module


class LongContextModule:
    """Mixin of the long-context classes, each `class Long(LongContextModule, Upstream)`: `upstream` is
    the class it extends, `configure` sets its typed settings (shown by `print(model)`)."""

    upstream: type

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.upstream = cls.__bases__[-1]

    def configure(self, *args: Any, **settings: Any) -> None:  # a subclass with settings names them
        pass

    @classmethod
    def install(cls, module: nn.Module, **settings) -> nn.Module:
        """Turn an upstream module into `cls` in place (or reconfigure one); returns it."""
        if type(module) is not cls:
            if type(module) is not cls.upstream:
                hint = ("; install the long-context classes before recompute and FSDP2 wrap the module"
                        if isinstance(module, cls.upstream) else "")
                raise TypeError(f"{cls.__name__}.install expects a {cls.upstream.__name__}, "
                                f"got {type(module).__name__}{hint}")
            swap_class(module, cls)
        assert isinstance(module, cls)
        module.configure(**settings)
        return module
