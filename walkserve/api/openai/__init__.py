"""The OpenAI protocol: request planning, choice tracking, chunk and response shapes."""
