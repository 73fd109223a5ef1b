#!/usr/bin/env bash
# System packages vitkit uses, installed where apt exists and we may use it (root, or
# passwordless sudo). Never fatal: without them vitkit downloads Fashion-MNIST or says how
# to get it, and the tests that need the real data are skipped with a reason.
set -u
if [ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then exit 0; fi
command -v apt-get >/dev/null 2>&1 || exit 0
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo -n"; fi
if $SUDO apt-get update -qq >/dev/null && $SUDO apt-get install -y -qq dataset-fashion-mnist >/dev/null; then
  echo "installed dataset-fashion-mnist"
else
  echo "note: could not install dataset-fashion-mnist with apt-get; continuing without it"
fi
