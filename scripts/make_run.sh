#!/bin/sh
# make run: prepares the default model (a small SYNTHETIC DeepSeek-V4 checkpoint with random weights,
# written by `dsv4 synth`) if it is missing, then runs a short streamed chat demo with it. When stdin
# and stdout are a terminal, an interactive `dsv4 chat` follows; otherwise it exits (never waits for input).
#   DSV4_MODEL=DIR      use another model directory (e.g. a real DeepSeek-V4 checkpoint)
#   DSV4_PROMPT=TEXT    the demo prompt
#   DSV4_MAX_TOKENS=N   tokens of the demo answer (default 24)
set -e
cd "$(dirname "$0")/.."
BIN="${BUILD:-build}/dsv4"
MODEL="${DSV4_MODEL:-models/synth-default}"
PROMPT="${DSV4_PROMPT:-Hello! Who are you?}"
MAXTOK="${DSV4_MAX_TOKENS:-24}"
# On a busy machine OpenMP's spinning barriers cost more than they save.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"

if [ ! -x "$BIN" ]; then
    echo "make_run.sh: $BIN is missing; run make first" >&2
    exit 1
fi
if [ ! -f "$MODEL/config.json" ] || [ ! -f "$MODEL/tokenizer.json" ] || \
   { [ ! -f "$MODEL/model.safetensors" ] && [ ! -f "$MODEL/model.safetensors.index.json" ]; }; then
    if [ -n "$DSV4_MODEL" ]; then
        echo "make_run.sh: $MODEL is not a model directory (config.json, tokenizer.json, safetensors)" >&2
        exit 1
    fi
    echo "== preparing the default model: $BIN synth -o $MODEL" >&2
    "$BIN" synth -o "$MODEL"
fi

echo "== demo: $BIN run -m $MODEL --chat -p \"$PROMPT\" --max-tokens $MAXTOK --seed 0" >&2
"$BIN" run -m "$MODEL" --chat -p "$PROMPT" --max-tokens "$MAXTOK" --seed 0 </dev/null

if [ -t 0 ] && [ -t 1 ]; then
    echo "== interactive: $BIN chat -m $MODEL  (/exit or Ctrl-D to quit)" >&2
    exec "$BIN" chat -m "$MODEL" --max-tokens 128
fi
