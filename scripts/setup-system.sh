#!/usr/bin/env bash
# System packages vitkit uses, installed where apt exists and we may use it (root, or
# passwordless sudo). Never fatal: without them vitkit downloads Fashion-MNIST or says how
# to get it, and the tests that need them are skipped with a reason (outside CI).
#   dataset-fashion-mnist  the default data (/usr/share/datasets/fashion-mnist/)
#   chromium               headless browser that opens `vitkit inspect`'s report.html in the tests
set -u
want=()
[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] || want+=(dataset-fashion-mnist)
command -v chromium >/dev/null 2>&1 || want+=(chromium)
[ ${#want[@]} -eq 0 ] && exit 0
command -v apt-get >/dev/null 2>&1 || { echo "note: no apt-get; not installing ${want[*]}"; exit 0; }
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo -n"; fi
if $SUDO apt-get update -qq >/dev/null && $SUDO apt-get install -y -qq "${want[@]}" >/dev/null; then
  echo "installed ${want[*]}"
else
  echo "note: could not install ${want[*]} with apt-get; continuing without"
fi
exit 0
