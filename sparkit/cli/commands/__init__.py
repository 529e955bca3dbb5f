"""Every `sparkit` command, declared once (pip's `commands_dict`): its name, the module of this
package that holds it, what in that module is the command, and the one-line summary `sparkit
--help` lists. The order here is the order of `sparkit --help`.

This is the one lazy import point of the CLI: a command's module is imported when that command is
run or its --help is asked for (sparkit.cli.command_tree.build_command), never before, so `sparkit
--help` imports none of them (and no typer: sparkit.cli.root_help draws that screen from this
table alone). A command's module may import what it likes at its top; what only one command needs
is imported inside it.

A command's --help is its summary, then its function's docstring (the paragraphs after the
summary). A command with sub-commands (`sparkit recipes list`) is a typer.Typer of
sparkit.cli.command_tree.SparkitTyper; its summary is that group's help."""

from __future__ import annotations

from collections import namedtuple

CommandInfo = namedtuple("CommandInfo", "module, attribute, summary")

COMMANDS: dict[str, CommandInfo] = {
    "plan": CommandInfo("plan", "plan_cmd", "Show the exact engine launch a recipe compiles to (no GPU needed), and "
                        "the decode speed the memory bandwidth allows it (its arithmetic with --verbose)."),
    "doctor": CommandInfo("doctor", "doctor_cmd", "Host and engine report, which shipped recipe targets this host "
                          "can run, and its memory bandwidth."),
    "pull": CommandInfo("pull", "pull", "Download exactly the files a recipe's engine reads (config, tokenizer, chat "
                        "template, generation config, the safetensors shards its index names; a separate draft model "
                        "too) into the Hugging Face cache, each verified against the hub's sha256; resumes where it "
                        "stopped."),
    "up": CommandInfo("up", "up", "Start a server from a recipe, prove each optimisation is active, then stream its "
                      "log (or --detach)."),
    "status": CommandInfo("status", "status", "List servers: id, recipe, engine, URL, pid, uptime, health, last tok/s "
                          "and accept length."),
    "logs": CommandInfo("logs", "logs", "Print a server's log."),
    "down": CommandInfo("down", "down", "Stop servers (SIGTERM to the process group, SIGKILL after the grace period)."),
    "check": CommandInfo("check", "check", "Run the activation checks again against a live server."),
    "chat": CommandInfo("chat", "chat", "Chat in the terminal with live decode tok/s, TTFT and accept length."),
    "run": CommandInfo("run", "run_cmd", "Chat with a recipe: a server running it is reused, else one is brought up "
                       "(preflight, startup checks) and stopped when the chat closes (--keep leaves it running)."),
    "tune": CommandInfo("tune", "tune", "Sweep recipe values (one server each), rank by TPOT and step-time estimate, "
                        "write the best recipe to a new file."),
    "verify": CommandInfo("verify", "verify", "Correctness gate: byte-exact greedy outputs, accept length within 0.05, "
                          "no state pollution (for a rounding-changing optimisation such as an FP8 lm_head: token "
                          "agreement and accept length)."),
    "ladder": CommandInfo("ladder", "ladder_cmd", "Run a ladder of recipes on this machine, one server at a time: each "
                          "step with its startup checks, decode speed on one fixed workload, accept length, "
                          "known-answer perplexity and optionally a GSM8K subset; one table of what each step bought, "
                          "beside the published figure."),
    "recipes": CommandInfo("recipes", "recipes_app", "List, show and validate recipes."),
    "eval": CommandInfo("eval", "eval_app", "Accuracy checks: GSM8K on a live server, and a paired comparison of two "
                        "runs."),
    "bench": CommandInfo("bench", "bench_app", "Batch-1 decode benchmark (TPOT, TTFT, ITL, throughput, accept length, "
                         "step-time estimate)."),
    "model": CommandInfo("model", "model_app", "Built-in models: build tiny-ling or tiny-ling-v3, the embedded engine's models, and "
                         "tiny-ling's DSpark draft."),
}

# The root command's own help and options (sparkit.cli.command_tree declares it with these; root_help draws it).
SPARKIT_HELP = "Fast, provably correct batch-1 MoE decoding: recipes, launch, startup checks, chat, eval, bench."
USAGE = "sparkit [OPTIONS] COMMAND [ARGS]..."
ROOT_OPTIONS = (("--version", "Show the version and exit."), ("--help", "Show this message and exit."))
