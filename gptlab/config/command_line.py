"""Checks of a gptlab-train / gptlab-decode command line made before Hydra reads it, each a one-line ConfigError:
shell-completion misuse (Hydra raises a traceback), and Hydra's own spelling of a launcher gptlab presets
(`hydra/launcher=submitit_slurm` gets the plugin's stock settings, without the preset's requeue, time limit and
resources from hardware.*: refused naming `launcher=slurm`, before any job is submitted)."""

from __future__ import annotations

from gptlab.errors import ConfigError

COMPLETION_FLAGS = ("--shell-completion", "-sc")
SHELLS = ("bash", "zsh", "fish")
PRESETS = {"slurm": "submitit_slurm", "local": "submitit_local"}  # conf/launcher/<preset>.yaml -> its Hydra launcher


def check_completion(args: list[str]) -> None:
    """Refuse completion misuse in one line (Hydra raises a traceback): one of install|uninstall|query=SHELL."""
    if not any(a in COMPLETION_FLAGS for a in args):
        return
    rest = [a for a in args if a not in COMPLETION_FLAGS]
    command, _, shell = rest[0].partition("=") if len(rest) == 1 else ("", "", "")
    if command not in ("install", "uninstall", "query") or shell not in SHELLS:
        got = " ".join(rest) or "nothing"
        raise ConfigError(
            f"--shell-completion: got {got}; allowed: exactly one of install=SHELL or uninstall=SHELL "
            f"(SHELL: {', '.join(SHELLS)}), "
            f'e.g. eval "$(gptlab-train --shell-completion install=bash)"'
        )


def check_launcher(args: list[str]) -> None:
    """Refuse a Hydra launcher chosen without (or against) the gptlab preset over it: `hydra/launcher=submitit_slurm`
    is `launcher=slurm`, `hydra/launcher=submitit_local` is `launcher=local`."""
    picked: dict[str, str] = {}
    for arg in args:
        key, sep, value = arg.partition("=")
        if sep and key.lstrip("+~") in ("hydra/launcher", "launcher"):
            picked[key.lstrip("+~")] = value.strip("'\"")
    stock, preset = picked.get("hydra/launcher"), picked.get("launcher")
    wanted = next((name for name, launcher in PRESETS.items() if launcher == stock), None)
    if wanted is not None and preset != wanted:
        also = f"; launcher={preset} sets hydra/launcher={PRESETS[preset]} itself" if preset in PRESETS else ""
        raise ConfigError(
            f"hydra/launcher={stock}: Hydra's spelling, which gets the plugin's stock settings without gptlab's preset "
            f"(requeue, time limit, resources from hardware.*){also}; allowed: launcher={wanted} (its keys can be "
            "overridden as hydra.launcher.KEY=VALUE)"
        )


def check_command_line(args: list[str]) -> None:
    """Every check above, on the arguments after the program name."""
    check_completion(args)
    check_launcher(args)
