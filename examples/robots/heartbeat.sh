#!/usr/bin/env bash
# An `exec` robot: counts beats, checkpoints each one, and checkpoints once more on
# SIGTERM before exiting. Its context arrives as JSON in the file SLOTPOOL_CONTEXT_FILE
# (and in SLOTPOOL_CONTEXT while it is small).
set -u
beats=$(sed -n 's/.*"beats"[^0-9]*\([0-9][0-9]*\).*/\1/p' "$SLOTPOOL_CONTEXT_FILE")
beats=${beats:-0}
echo "robot $SLOTPOOL_ROBOT starting at beat $beats (epoch $SLOTPOOL_EPOCH)"
stop() {
  echo "{\"checkpoint\": {\"beats\": $beats, \"stopped\": true}}"
  exit 0
}
trap stop TERM
while true; do
  sleep "${BEAT_SECONDS:-1}" &
  wait $!
  beats=$((beats + 1))
  echo "{\"checkpoint\": {\"beats\": $beats}}"
done
