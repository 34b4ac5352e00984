%% @doc The status page's routes: the one `inets' httpd module of the
%% listener (`couch_workers_http'); `do/1' runs in httpd's request process.
%%
%% ```
%% GET /                    the HTML status page (refreshes itself)
%% GET /metrics             this node's metrics, Prometheus text format
%% GET /api/status          the page's data as JSON
%% GET /api/worker_types    ["Type", ...]
%% GET /api/workers/Type    [{id, opts, timeout, heartbeat_age_ms, running}, ...]  (Type percent-encoded)
%% GET /api/metrics         metrics/0 as JSON
%% GET /job/Type/Id         one job and its last runs (HTML; Type and Id percent-encoded)
%% '''
%%
%% Another method is 405 (with `Allow: GET'; a method httpd does not
%% serve at all, such as OPTIONS, is its own 501), another path 404, a
%% path that does not decode 400; an error while answering is logged and
%% answered 500, so no request can crash anything but its own httpd
%% process. Malformed HTTP itself is answered 4xx by httpd.
-module(couch_workers_http_handler).

-export([do/1]).

-include_lib("inets/include/httpd.hrl").
-include_lib("kernel/include/logger.hrl").

-define(IS_HEX(C), ((C >= $0 andalso C =< $9) orelse (C >= $a andalso C =< $f) orelse (C >= $A andalso C =< $F))).

-spec do(#mod{}) -> {proceed, list()}.
do(#mod{method = Method, request_uri = Uri} = Mod) ->
    Response =
        try
            route(Method, path(Uri))
        catch
            throw:{status, Code, Text} ->
                text(Code, Text);
            Class:Reason:Stack ->
                ?LOG_ERROR(#{what => status_page_error, uri => Uri, class => Class, reason => Reason, stacktrace => Stack}),
                text(500, "internal error\n")
        end,
    {proceed, [{response, Response} | Mod#mod.data]}.

%% The path's segments, percent-decoded; the query string is ignored.
path(Uri) ->
    [Path | _] = string:split(Uri, "?"),
    Segments = [S || S <- string:split(Path, "/", all), S =/= ""],
    [decode(S) || S <- Segments].

%% Strict percent-decoding: a `%' not followed by two hex digits is a
%% bad request (uri_string:percent_decode/1 lets `%4' through).
decode(Segment) ->
    decode(list_to_binary(Segment), <<>>).

decode(<<"%", H, L, Rest/binary>>, Acc) when ?IS_HEX(H), ?IS_HEX(L) ->
    decode(Rest, <<Acc/binary, (binary_to_integer(<<H, L>>, 16))>>);
decode(<<"%", _/binary>>, _Acc) ->
    throw({status, 400, "bad percent-encoding in the path\n"});
decode(<<C, Rest/binary>>, Acc) ->
    decode(Rest, <<Acc/binary, C>>);
decode(<<>>, Acc) ->
    Acc.

route("GET", []) ->
    Status = couch_workers_status:collect(couch_workers_http:history()),
    reply(200, "text/html; charset=utf-8", couch_workers_status_page:render(Status));
route("GET", [<<"metrics">>]) ->
    reply(200, couch_workers_prometheus:content_type(), couch_workers:metrics(prometheus));
route("GET", [<<"api">>, <<"status">>]) ->
    json(couch_workers_status:collect(couch_workers_http:history()));
route("GET", [<<"api">>, <<"worker_types">>]) ->
    json(ok_or_503(couch_workers:worker_types()));
route("GET", [<<"api">>, <<"workers">>, Type]) ->
    json(ok_or_503(couch_workers:workers(Type)));
route("GET", [<<"api">>, <<"metrics">>]) ->
    json(couch_workers:metrics());
route("GET", [<<"job">>, Type, Id]) ->
    case couch_workers:job_get(Type, Id) of
        {ok, Job} -> reply(200, "text/html; charset=utf-8", couch_workers_job_page:render(Job));
        {error, not_found} -> text(404, "no such job\n");
        {error, key_too_large} -> text(400, "the type or id is over the key limit\n");
        {error, Reason} -> text(503, io_lib:format("store unavailable: ~p~n", [Reason]))
    end;
route("GET", _) ->
    text(404, "not found\n");
route(_Method, _Path) ->
    {response, [{code, 405}, {content_type, "text/plain"}, {allow, "GET"}, {content_length, "19"}], "method not allowed\n"}.

ok_or_503(List) when is_list(List) -> List;
ok_or_503({error, key_too_large}) -> throw({status, 400, "the type is over the key limit\n"});
ok_or_503({error, Reason}) -> throw({status, 503, io_lib:format("store unavailable: ~p~n", [Reason])}).

json(Term) ->
    reply(200, "application/json", couch_workers_json:encode(Term)).

text(Code, Text) ->
    reply(Code, "text/plain; charset=utf-8", Text).

reply(Code, ContentType, Body) ->
    Bin = iolist_to_binary(Body),
    {response, [{code, Code}, {content_type, ContentType}, {content_length, integer_to_list(byte_size(Bin))}], Bin}.
