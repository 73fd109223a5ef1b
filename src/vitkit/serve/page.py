"""``GET /``: a page where a person drops an image and sees the top classes and, on the PyTorch
runtime, the attention rollout over it; and ``/example.png``, an image to try it with.

One self-contained HTML file (no CDN: the server may have no network), talking to the same
endpoints a client would. ``/?example=1`` classifies the example on load (what the browser test
does): the example goes through the same path as a dropped file.
"""

from __future__ import annotations

import functools
import html
import io
from typing import Any

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>__TITLE__</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body { font: 15px/1.45 system-ui, sans-serif; margin: 2rem auto; max-width: 760px; color: #222; padding: 0 1rem; }
h1 { font-size: 1.35rem; margin-bottom: .2rem; } .sub { color: #666; margin-top: 0; }
#drop { border: 2px dashed #999; border-radius: 10px; padding: 2rem; text-align: center; cursor: pointer; }
#drop.over { background: #eef5ff; border-color: #3478f6; }
#shown { display: flex; gap: 1rem; margin-top: 1rem; align-items: flex-start; flex-wrap: wrap; }
#shown img { max-width: 240px; max-height: 240px; image-rendering: pixelated; border: 1px solid #ddd; }
#rollout { max-width: 100%; }
table { border-collapse: collapse; min-width: 300px; } td { padding: .15rem .5rem; }
.bar { background: #3478f6; height: .8rem; border-radius: 3px; }
#error { color: #b00020; white-space: pre-wrap; } #key { width: 18rem; }
</style></head><body>
<h1>__TITLE__</h1><p class="sub" id="about">loading the model's description...</p>
<div id="drop">Drop an image here, or click to choose one
  <input type="file" id="file" accept="image/*" hidden></div>
<p><button id="try">Try the example image</button>
  <span id="keyrow" hidden>API key <input id="key" type="password" autocomplete="off"></span></p>
<div id="error"></div>
<div id="shown"><img id="input" alt="" hidden><table id="top"></table></div>
<p><img id="rollout" alt="" hidden></p>
<script>
const $ = (id) => document.getElementById(id);
let info = null;
function headers() { const k = $('key').value; return k ? {'Authorization': 'Bearer ' + k} : {}; }
async function describe() {
  const answer = await fetch('info', {headers: headers()});
  info = await answer.json().catch(() => null);
  if (answer.status === 401) {  // /info needs the key too: ask for it, and describe again once it is given
    $('keyrow').hidden = false; info = null;
    $('about').textContent = 'this server asks for an API key: enter it below'; return;
  }
  if (!info || info.error) {
    $('about').textContent = 'the model is not described (' + (info && info.error) + ')'; return;
  }
  $('about').textContent = info.model + ' on ' + info.runtime + ', input ' + info.input.join(' x ') + ', ' +
    info.classes + ' classes; requests batched up to ' + info.max_batch + ' (' + info.max_wait_ms + ' ms wait)';
  $('keyrow').hidden = !info.key;
}
async function classify(blob, name) {
  $('error').textContent = ''; $('top').innerHTML = ''; $('rollout').hidden = true;
  $('input').src = URL.createObjectURL(blob); $('input').hidden = false;
  const answer = await fetch('predict?top_k=5', {method: 'POST', body: blob, headers: headers()});
  const body = await answer.json();
  if (!answer.ok) { $('error').textContent = body.error || ('error ' + answer.status); return; }
  for (const t of body.top) {
    const row = $('top').insertRow();
    row.className = 'label';
    row.insertCell().textContent = t.label;
    row.insertCell().textContent = (100 * t.probability).toFixed(1) + '%';
    const bar = document.createElement('div'); bar.className = 'bar';
    bar.style.width = Math.max(2, 160 * t.probability) + 'px';
    row.insertCell().appendChild(bar);
  }
  document.documentElement.setAttribute('data-top-label', body.top[0].label);
  if (info && info.embed) {
    const r = await fetch('rollout', {method: 'POST', body: blob, headers: headers()});
    if (r.ok) { $('rollout').src = URL.createObjectURL(await r.blob()); $('rollout').hidden = false; }
  }
}
async function example() { const r = await fetch('example.png'); await classify(await r.blob(), 'example'); }
$('drop').onclick = () => $('file').click();
$('file').onchange = () => { if ($('file').files[0]) classify($('file').files[0], $('file').files[0].name); };
$('drop').ondragover = (e) => { e.preventDefault(); $('drop').classList.add('over'); };
$('drop').ondragleave = () => $('drop').classList.remove('over');
$('drop').ondrop = (e) => { e.preventDefault(); $('drop').classList.remove('over');
  if (e.dataTransfer.files[0]) classify(e.dataTransfer.files[0], e.dataTransfer.files[0].name); };
$('try').onclick = example;
$('key').onchange = () => describe().catch((e) => { $('error').textContent = String(e); });
describe().then(() => { if (new URLSearchParams(location.search).has('example')) return example(); })
  .catch((e) => { $('error').textContent = String(e); });
</script></body></html>
"""


def page_html(title: str = "vitkit") -> str:
    return _PAGE.replace("__TITLE__", html.escape(title))




def example_png(served: Any) -> bytes:
    """The first of ``vitkit inspect``'s default images for this model (a Fashion-MNIST test image for a
    28x28 grey model, else scikit-image's astronaut), or a gradient where neither is installed."""
    cached = getattr(served, "_example_png", None)
    if cached is None:
        cached = served._example_png = _render_example(served)
    return cached


def _render_example(served: Any) -> bytes:
    from PIL import Image

    from ..inspect.report import default_images

    try:
        image = default_images(served)[0][1]
    except Exception:  # no data nor scikit-image here: any image shows the page working
        h, w = (int(v) for v in served.config.img_size)
        image = Image.linear_gradient("L").resize((w, h)).convert("L" if served.channels == 1 else "RGB")
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


@functools.lru_cache(maxsize=1)
def favicon_png() -> bytes:
    """The tab's icon, ``/favicon.ico`` (a browser asks for it on every page: a 404 there was the only one in a
    normal visit's log): an image cut into 4 x 4 patches, as a ViT reads it. PNG, which browsers take at that path."""
    from PIL import Image, ImageDraw

    icon = Image.new("RGBA", (32, 32), (0, 0, 0, 0))
    draw = ImageDraw.Draw(icon)
    for i in range(16):
        row, col = divmod(i, 4)  # 7 px patches 1 px apart, bluer towards the bottom right
        draw.rectangle((col * 8, row * 8, col * 8 + 6, row * 8 + 6), fill=(52, 120, 186 + 10 * (row + col), 255))
    out = io.BytesIO()
    icon.save(out, format="PNG")
    return out.getvalue()
