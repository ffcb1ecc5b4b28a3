// Runs under Deno (test/envs/deno.test.ts starts it): the environments and the notebook helpers import and
// work there too, node:sqlite's FTS5 included.
import { EmailDatabase, generateInbox, InboxTools } from "../../lib/envs/arte/mod.ts";
import { Game2048, rolloutTicTacToe, heuristicPolicyTicTacToe } from "../../lib/envs/mod.ts";
import { rewardCurve, stepRecord, transcript } from "../../lib/notebook/mod.ts";

const inbox = generateInbox({ seed: 5, emails: 400 });
const db = new EmailDatabase();
db.insert(inbox.emails);
const q = inbox.questions[0]!;
const tools = new InboxTools(db, q.inboxAddress, q.queryDate);
const hits = JSON.parse(tools.call("search_emails", JSON.stringify({ keywords: [q.answer] }))) as { messageId: string }[];
const game = new Game2048({ seed: 3 });
game.move("left");
const t = await rolloutTicTacToe(heuristicPolicyTicTacToe, { seed: 1 });
const plot = rewardCurve([stepRecord(0, [t])]);
console.log(JSON.stringify({
  found: hits.some((h) => h.messageId === q.messageIds[0]),
  board: game.render(),
  transcriptHasHtml: String(transcript(t).toMimeBundle()["text/html"]).includes("<div"),
  plotHasFigure: Array.isArray(plot.figure.data),
}));
