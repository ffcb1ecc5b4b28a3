/**
 * `text` cut to at most `limit` UTF-16 units, `more(hidden)` added when anything is cut. The cut never splits a
 * surrogate pair: half a pair is not Unicode, and a UTF-8 writer that checks (nbconvert saving an executed notebook)
 * refuses the whole document over it. Model output holds astral characters (emoji, or whatever a small model samples)
 * wherever the cut falls.
 */
export function clipText(text: string, limit: number, more: (hidden: number) => string = () => "…"): string {
  if (text.length <= limit) return text;
  const code = text.charCodeAt(limit - 1);
  const end = code >= 0xd800 && code <= 0xdbff ? limit - 1 : limit;
  return text.slice(0, end) + more(text.length - end);
}
