def test_dbg(lambda_, users, model):
    from tests.handlers.conftest import http_event, token_for
    token = token_for(users.create().user_id)
    lambda_.invoke("chat", http_event("chat.json", token=token, body={"message": "x"}))
    lambda_.invoke("chat", http_event("chat.json", token=token, body={"message": "x"}))
    print(lambda_.logs.getvalue())
    assert 0
