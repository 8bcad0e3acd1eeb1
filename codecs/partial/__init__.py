"""Reading part of a body without decoding it whole: the end of a response
(``tail``), and a Fetch response walked as its bytes pass (``fetch_walk``)."""
