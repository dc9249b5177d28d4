"""What an encoder served behind an API needs besides the protocol, one concern a module; the
backend that uses them, and reads as the story of one call, is
:mod:`encmap.encoders.backends.openai_api`.

``keys`` (the API key: read, checked, redacted from a server's words), ``cache`` (the vectors paid
for, on disk), ``budget`` (an entry's ``max_tokens`` across calls and processes), ``ratelimit``
(an entry's requests a minute), ``deadline`` (one deadline for a request's whole answer, its
retries included), ``answers`` (a server's answer parsed and checked, its errors made refusals) and
``drift`` (a model changed under its name).
"""
