/** Public names of ART·E: the synthetic inbox, its SQLite FTS5 search, the agent's tools and the rollout. */
export { generateInbox, type Email, type InboxOptions, type InboxQuestion, type SyntheticInbox } from "./inbox.ts";
export { EmailDatabase, MAX_SEARCH_RESULTS, type SearchHit, type SearchQuery } from "./database.ts";
export { ARTE_TOOLS, InboxTools, type FinalAnswer } from "./tools.ts";
export { inboxMcpServer, INBOX_MCP_TOOLS, type InboxMcpOptions } from "./mcp.ts";
export { loadEnronQuestions, type LoadQuestionsOptions } from "./questions.ts";
export { answerMatches, arteSystemPrompt, rolloutArte, scoreArteAnswer, type ArteRolloutOptions } from "./rollout.ts";
