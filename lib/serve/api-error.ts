/**
 * Errors of the OpenAI-compatible API, answered as OpenAI does: an HTTP status and
 * `{ "error": { "message", "type", "param", "code" } }`. The `openai` client turns these into its typed
 * errors (BadRequestError, NotFoundError, ...), so agents handle them as they would with OpenAI.
 */
import { ArtError } from "../core/errors.ts";

export type ApiErrorType = "invalid_request_error" | "authentication_error" | "rate_limit_error" | "server_error";

export class ApiError extends ArtError {
  readonly status: number;
  readonly type: ApiErrorType;
  readonly param: string | null;
  readonly apiCode: string | null;

  constructor(status: number, message: string, type: ApiErrorType, param: string | null, code: string | null) {
    super(code ?? type, message);
    this.name = "ApiError";
    this.status = status;
    this.type = type;
    this.param = param;
    this.apiCode = code;
  }

  static invalid(param: string | null, message: string, code: string | null = null): ApiError {
    return new ApiError(400, message, "invalid_request_error", param, code);
  }

  /** `qualifier` "at least " when the prompt's count is a bound found without tokenizing it. */
  static contextLength(maxPositions: number, promptTokens: number, completionTokens: number, qualifier = ""): ApiError {
    return new ApiError(
      400,
      `This model's maximum context length is ${maxPositions} tokens. However, you requested ${qualifier}${promptTokens + completionTokens} tokens ` +
        `(${qualifier}${promptTokens} in the messages, ${completionTokens} in the completion). Please reduce the length of the messages or completion.`,
      "invalid_request_error",
      "messages",
      "context_length_exceeded",
    );
  }

  toJSON(): { error: { message: string; type: ApiErrorType; param: string | null; code: string | null } } {
    return { error: { message: this.message, type: this.type, param: this.param, code: this.apiCode } };
  }
}

/** Any thrown value as an ApiError: ArtErrors from bad input are 400s, anything else a 500 that names it. */
export function toApiError(error: unknown): ApiError {
  if (error instanceof ApiError) return error;
  if (error instanceof ArtError) return new ApiError(400, error.message, "invalid_request_error", null, error.code);
  const message = error instanceof Error ? `${error.name}: ${error.message}` : String(error);
  return new ApiError(500, `internal error while serving the request: ${message}`, "server_error", null, null);
}
