"""Layout checks run in the page: what overflows its card, and which cards are empty."""

# Every element of a visible card lies within the card, unless a scrolling box inside the
# card clips it; every table fits its scrolling box; the page itself never scrolls sideways.
OVERFLOWS = """() => {
  const name = (n) => n.id ? `#${n.id}`
    : `${n.tagName.toLowerCase()}.${[...n.classList].join(".")}`;
  const span = (r) => `[${Math.round(r.left)}, ${Math.round(r.right)}]`;
  const clipped = (node, card) => {
    for (let n = node.parentElement; n && n !== card; n = n.parentElement) {
      if (getComputedStyle(n).overflowX !== "visible") return true;
    }
    return false;
  };
  const out = [];
  const root = document.documentElement;
  if (root.scrollWidth > root.clientWidth) {
    out.push(`the page scrolls: ${root.scrollWidth} > ${root.clientWidth}`);
  }
  for (const card of document.querySelectorAll(".card")) {
    const box = card.getBoundingClientRect();
    if (!card.offsetParent || !box.width) continue;
    if (card.scrollWidth > card.clientWidth + 1) {
      out.push(`${name(card)} scrolls: ${card.scrollWidth} > ${card.clientWidth}`);
    }
    for (const node of card.querySelectorAll("*")) {
      const r = node.getBoundingClientRect();
      if (!r.width || !r.height || clipped(node, card)) continue;
      if (r.right > box.right + 1 || r.left < box.left - 1) {
        out.push(`${name(node)} ${span(r)} leaves ${name(card)} ${span(box)}`);
      }
    }
  }
  for (const table of document.querySelectorAll("table")) {
    const wrap = table.parentElement;
    if (!table.offsetParent || !wrap.clientWidth) continue;
    if (table.offsetWidth > wrap.clientWidth + 1) {
      out.push(`${name(table)} is ${table.offsetWidth} px in ${wrap.clientWidth} px`);
    }
  }
  return out;
}"""

# Cards that hold a heading and nothing else.
EMPTY_CARDS = """() => [...document.querySelectorAll(".card")]
  .filter((c) => c.offsetParent)
  .filter((c) => c.innerText.trim() === (c.querySelector("h2")?.innerText.trim() ?? ""))
  .map((c) => c.innerText.trim() || "(blank)")"""
