%% @doc The status page (app env `http'): its endpoints answer with the
%% right status and content type and show a worker type and a job type;
%% malformed paths, methods and requests are 4xx; it binds to loopback
%% by default; no listener runs when `http' is unset; a bad `http' value
%% stops the app's start.
-module(couch_workers_http_tests).

-include("couch_workers_test.hrl").

-import(couch_workers_test_util, [unique_type/1]).

http_test_() ->
    {
        "status page",
        {
            setup,
            fun() ->
                {ok, _} = application:ensure_all_started(inets),
                couch_workers_test_util:start_app(#{http => #{port => 0}})
            end,
            fun(Ctx) ->
                couch_workers_test_util:stop_app(Ctx),
                application:unset_env(couch_workers, http)
            end,
            fun(_) ->
                [
                    {"bound to 127.0.0.1 by default", ?_test(bound_to_loopback())},
                    {"/ shows a worker type and a job type", ?_test(page_shows_workers_and_jobs())},
                    {"/ shows a job type's counts by state, latest failures and paused flag", ?_test(page_shows_job_states())},
                    {"/ shows each worker type's leader and each job type's schedules", ?_test(page_shows_leaders_and_schedules())},
                    {"/ shows the schedules of a job type that has no job yet", ?_test(page_shows_a_schedule_before_its_first_job())},
                    {"/job/Type/Id shows a job's last runs; / links failed jobs to it", ?_test(job_page_shows_runs())},
                    {"/metrics is Prometheus text", ?_test(metrics_endpoint())},
                    {"/ and /metrics show running jobs beside max_running", ?_test(running_beside_limits())},
                    {"/api/... is JSON", ?_test(api_endpoints())},
                    {"unknown paths 404, bad encodings 400, other methods 405", ?_test(bad_requests_are_4xx())},
                    {"malformed HTTP is 4xx and the listener goes on", ?_test(malformed_http_is_4xx())},
                    {"a killed listener server restarts with a listener", ?_test(killed_server_restarts())}
                ]
            end
        }
    }.

off_by_default_test_() ->
    {
        "status page off",
        {
            setup,
            fun() -> couch_workers_test_util:start_app() end,
            fun couch_workers_test_util:stop_app/1,
            fun(_) -> [{"no listener without http", ?_test(no_listener())}] end
        }
    }.

bad_config_test_() ->
    [
        {"a bad http value stops the start", ?_test(bad_config_refused())},
        {"parse_config/1", ?_test(parse_config())}
    ].

%% ---- tests ---------------------------------------------------------------

url(Path) ->
    "http://127.0.0.1:" ++ integer_to_list(couch_workers_http:port()) ++ Path.

http_get(Path) ->
    {ok, {{_, Code, _}, Headers, Body}} = httpc:request(get, {url(Path), []}, [{timeout, 10000}], [{body_format, binary}]),
    {Code, proplists:get_value("content-type", Headers), Body}.

bound_to_loopback() ->
    Port = couch_workers_http:port(),
    ?assert(is_integer(Port) andalso Port > 0),
    [Pid] = httpd_instances(),
    ?assertEqual([{bind_address, {127, 0, 0, 1}}], httpd:info(Pid, [bind_address])),
    %% Not on another address of this host (if it has one).
    case non_loopback_address() of
        undefined -> ok;
        Ip -> ?assertMatch({error, _}, gen_tcp:connect(Ip, Port, [], 2000))
    end.

httpd_instances() ->
    %% The instance is linked to couch_workers_http.
    {links, Links} = process_info(whereis(couch_workers_http), links),
    [P || P <- Links, is_pid(P), is_httpd(P)].

is_httpd(P) ->
    try httpd:info(P, [port]) of
        [{port, _}] -> true;
        _ -> false
    catch
        _:_ -> false
    end.

non_loopback_address() ->
    {ok, Addrs} = inet:getifaddrs(),
    case [A || {_, Opts} <- Addrs, {addr, A} <- Opts, tuple_size(A) =:= 4, element(1, A) =/= 127] of
        [A | _] -> A;
        [] -> undefined
    end.

page_shows_workers_and_jobs() ->
    WT = <<"web<b>", (unique_type("wt"))/binary>>,
    W = couch_workers:worker_register(WT, <<"w&1">>, #{slots => 3}, self()),
    ok = couch_workers:job_add(WT, <<"j1">>, #{}, #{}),
    %% A job type that no worker has: listed among the job types.
    JT = unique_type("jobs_only"),
    ok = couch_workers:job_add(JT, <<"j1">>, #{}, #{}),
    {200, CT, Html} = http_get("/"),
    ?assertNotEqual(nomatch, binary:match(Html, <<"<tr><td>", JT/binary, "</td>">>)),
    ?assertEqual("text/html; charset=utf-8", CT),
    %% Escaped, not raw: no markup comes from a type or id.
    Esc = iolist_to_binary(couch_workers_status_page:escape(WT)),
    ?assertNotEqual(nomatch, binary:match(Html, Esc)),
    ?assertEqual(nomatch, binary:match(Html, WT)),
    ?assertNotEqual(nomatch, binary:match(Html, <<"w&amp;1">>)),
    ?assertNotEqual(nomatch, binary:match(Html, <<"http-equiv=\"refresh\"">>)),
    %% A heartbeat bar for the worker, and the job type's pending count.
    ?assertNotEqual(nomatch, binary:match(Html, <<"class=\"bar\"">>)),
    ?assertNotEqual(nomatch, binary:match(Html, <<"{&quot;slots&quot;:3}">>)),
    ok = couch_workers:job_remove(WT, <<"j1">>),
    ok = couch_workers:job_remove(JT, <<"j1">>),
    ok = couch_workers:worker_unregister(W).

page_shows_job_states() ->
    T = unique_type("states"),
    W = couch_workers:worker_register(T, <<"w1">>, #{}, self()),
    ok = couch_workers:job_add_many(T, [{<<"f1">>, #{}, #{}}, {<<"f2">>, #{}, #{}}, {<<"p1">>, #{}, #{priority => 9}}]),
    {ok, #{id := <<"f1">>} = F1} = couch_workers:job_accept(W, #{}),
    ok = couch_workers:job_fail(F1, #{<<"reason">> => <<"disk <full>">>}, #{retry => false}),
    {ok, #{id := <<"f2">>} = F2} = couch_workers:job_accept(W, #{}),
    ok = couch_workers:job_fail(F2, #{<<"reason">> => <<"second">>}, #{retry => false}),
    {200, _, Before} = http_get("/"),
    Row = fun(Html) ->
        {match, [R]} = re:run(Html, <<"<tr><td>", T/binary, "</td>.*?</tr>">>, [{capture, all, binary}]),
        R
    end,
    %% scheduled, pending, running, finished, canceled, failed
    Counts = iolist_to_binary([[<<"<td class=\"num\">">>, N, <<"</td>">>] || N <- [<<"0">>, <<"1">>, <<"0">>, <<"0">>, <<"0">>, <<"2">>]]),
    ?assertNotEqual(nomatch, binary:match(Row(Before), Counts)),
    ?assertNotEqual(nomatch, binary:match(Row(Before), <<"<td>no</td>">>)),
    %% The latest failure first, its error escaped.
    {match, [{P2, _}]} = re:run(Row(Before), <<"f2: \\{&quot;reason&quot;:&quot;second&quot;\\}">>),
    {match, [{P1, _}]} = re:run(Row(Before), <<"f1: \\{&quot;reason&quot;:&quot;disk &lt;full&gt;&quot;\\}">>),
    ?assert(P2 < P1),
    ok = couch_workers:job_pause(T),
    {200, _, After} = http_get("/"),
    ?assertNotEqual(nomatch, binary:match(Row(After), <<"<span class=\"paused\">paused</span>">>)),
    ?assertEqual(nomatch, binary:match(After, <<"n/a">>)),
    {200, "application/json", Json} = http_get("/api/status"),
    %% The type's own `paused' (the settings map between them has braces).
    ?assertMatch({match, _}, re:run(Json, <<"\"paused\":true(?:(?!\"type\":).)*\"type\":\"", T/binary, "\"|\"type\":\"", T/binary, "\"[^]]*\"paused\":true">>)),
    ok = couch_workers:job_resume(T),
    ok = couch_workers:worker_unregister(W).

page_shows_leaders_and_schedules() ->
    T = unique_type("ls"),
    W1 = couch_workers:worker_register(T, <<"w1">>, #{}, self()),
    W2 = couch_workers:worker_register(T, <<"w2">>, #{}, self()),
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    ok = couch_workers:schedule_set(T, <<"nightly">>, #{cron => <<"30 2 * * *">>}, #{}, #{}),
    [#{next_run_at := Next}] = couch_workers:schedules(T),
    NextText = list_to_binary(calendar:system_time_to_rfc3339(Next, [{unit, millisecond}, {offset, "Z"}])),
    {200, _, Page} = http_get("/"),
    ?assertNotEqual(nomatch, binary:match(Page, <<T/binary, " <span class=\"none\">(2 live; leader <b>w1</b>)">>)),
    ?assertNotEqual(nomatch, binary:match(Page, <<"<td>", T/binary, "</td><td>nightly</td>">>)),
    ?assertNotEqual(nomatch, binary:match(Page, <<"<td>", NextText/binary, "</td><td><span class=\"none\">none yet</span>">>)),
    {200, _, Json} = http_get("/api/status"),
    ?assertNotEqual(nomatch, binary:match(Json, <<"\"leader\":\"w1\"">>)),
    ?assertNotEqual(nomatch, binary:match(Json, <<"\"next_run_at\":", (integer_to_binary(Next))/binary>>)),
    ok = couch_workers:worker_unregister(W1),
    {200, _, After} = http_get("/"),
    ?assertNotEqual(nomatch, binary:match(After, <<T/binary, " <span class=\"none\">(1 live; leader <b>w2</b>)">>)),
    ok = couch_workers:schedule_remove(T, <<"nightly">>),
    ok = couch_workers:worker_unregister(W2).

%% A daily schedule set a minute ago has no job yet: its type is listed
%% from the schedules themselves, not from the job types.
page_shows_a_schedule_before_its_first_job() ->
    T = unique_type("schedonly"),
    ok = couch_workers:schedule_set(T, <<"daily">>, #{every => 86400000}, #{}, #{}),
    ?assertNot(lists:member(T, couch_workers:job_types())),
    [#{next_run_at := Next}] = couch_workers:schedules(T),
    NextText = list_to_binary(calendar:system_time_to_rfc3339(Next, [{unit, millisecond}, {offset, "Z"}])),
    {200, _, Page} = http_get("/"),
    ?assertNotEqual(nomatch, binary:match(Page, <<"<td>", T/binary, "</td><td>daily</td>">>)),
    ?assertNotEqual(nomatch, binary:match(Page, <<"<td>", NextText/binary, "</td><td><span class=\"none\">none yet</span>">>)),
    {200, _, Json} = http_get("/api/status"),
    ?assertNotEqual(nomatch, binary:match(Json, <<"\"next_run_at\":", (integer_to_binary(Next))/binary>>)),
    ok = couch_workers:schedule_remove(T, <<"daily">>),
    {200, _, After} = http_get("/"),
    ?assertEqual(nomatch, binary:match(After, <<"<td>", T/binary, "</td><td>daily</td>">>)).

job_page_shows_runs() ->
    T = unique_type("runs <&>"),
    W = couch_workers:worker_register(T, <<"w<1>">>, #{}, self()),
    Id = <<"j/1 \xff">>,
    ok = couch_workers:job_add(T, Id, #{}, #{max_attempts => 2}),
    {ok, J1} = couch_workers:job_accept(W, #{}),
    ok = couch_workers:job_fail(J1, #{<<"reason">> => <<"first">>}, #{delay => 0}),
    {ok, J2} = couch_workers:job_accept(W, #{timeout => 5000}),
    ok = couch_workers:job_fail(J2, #{<<"reason">> => <<"last">>}, #{}),
    Path = couch_workers_job_page:path(T, Id),
    ?assertMatch(<<"/job/runs%20%3C%26%3E", _/binary>>, Path),
    ?assertEqual(<<"/j%2F1%20%FF">>, binary:part(Path, byte_size(Path), -12)),
    {200, "text/html; charset=utf-8", Page} = http_get(binary_to_list(Path)),
    %% Newest first: run 2 failed, run 1 retried, each by the escaped worker.
    {match, [{P2, _}]} = re:run(Page, <<"<tr><td>2</td><td>w&lt;1&gt;</td><td>[0-9T:.-]+Z</td><td>[0-9T:.-]+Z</td><td>failed</td>">>),
    {match, [{P1, _}]} = re:run(Page, <<"<tr><td>1</td><td>w&lt;1&gt;</td><td>[^<]+</td><td>[^<]+</td><td>retried</td><td class=\"mono\">\\{&quot;reason&quot;:&quot;first&quot;\\}">>),
    ?assert(P2 < P1),
    {200, _, Status} = http_get("/"),
    ?assertNotEqual(nomatch, binary:match(Status, <<"<a href=\"", Path/binary, "\">runs</a>">>)),
    {404, _, _} = http_get(binary_to_list(couch_workers_job_page:path(T, <<"nope">>))),
    {400, _, _} = http_get(binary_to_list(couch_workers_job_page:path(T, binary:copy(<<"i">>, 10001)))),
    ok = couch_workers:worker_unregister(W).

metrics_endpoint() ->
    T = unique_type("mt"),
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    {200, CT, Text} = http_get("/metrics"),
    ?assertEqual("text/plain; version=0.0.4; charset=utf-8", CT),
    Samples = couch_workers_metrics_tests:parse(Text),
    ?assert(lists:any(
        fun({N, L, V}) -> N =:= <<"couch_workers_jobs_added_total">> andalso maps:get(<<"type">>, L) =:= T andalso V =:= 1.0 end,
        Samples
    )).

running_beside_limits() ->
    T = unique_type("lim"),
    Free = unique_type("free"),
    ok = couch_workers:job_type_set(T, #{max_running => 3, activity_timeout => 61}),
    W = couch_workers:worker_register(T, <<"w">>, #{}, self()),
    ok = couch_workers:job_add(T, <<"a">>, #{}, #{}),
    ok = couch_workers:job_add(Free, <<"b">>, #{}, #{}),
    {ok, _} = couch_workers:job_accept(W, #{timeout => 5000}),
    {200, _, Page} = http_get("/"),
    Row = <<"<tr><td>", T/binary, "</td><td class=\"num\">0</td><td class=\"num\">0</td><td class=\"num\">1 / 3</td>">>,
    ?assertNotEqual(nomatch, binary:match(Page, Row)),
    ?assertNotEqual(nomatch, binary:match(Page, <<"max running 3, activity timeout 61 s">>)),
    {200, _, Text} = http_get("/metrics"),
    Samples = couch_workers_metrics_tests:parse(Text),
    Gauge = fun(Name, Type) ->
        [V || {N, L, V} <- Samples, N =:= Name, maps:get(<<"type">>, L, none) =:= Type]
    end,
    ?assertEqual([1.0], Gauge(<<"couch_workers_jobs_running">>, T)),
    ?assertEqual([3.0], Gauge(<<"couch_workers_jobs_max_running">>, T)),
    ?assertEqual([0.0], Gauge(<<"couch_workers_jobs_running">>, Free)),
    ?assertEqual([infinity], Gauge(<<"couch_workers_jobs_max_running">>, Free)),
    ok = couch_workers:worker_unregister(W).

api_endpoints() ->
    T = unique_type("api"),
    W = couch_workers:worker_register(T, <<"w1">>, #{}, self()),
    {200, "application/json", Types} = http_get("/api/worker_types"),
    ?assertNotEqual(nomatch, binary:match(Types, <<"\"", T/binary, "\"">>)),
    {200, "application/json", Workers} = http_get("/api/workers/" ++ binary_to_list(T)),
    ?assertMatch(<<"[{\"heartbeat_age_ms\":", _/binary>>, Workers),
    ?assertNotEqual(nomatch, binary:match(Workers, <<"\"id\":\"w1\"">>)),
    %% A type that needs percent-encoding.
    T2 = <<T/binary, " /?">>,
    W2 = couch_workers:worker_register(T2, <<"w2">>, #{}, self()),
    {200, _, Workers2} = http_get("/api/workers/" ++ uri_string:quote(binary_to_list(T2))),
    ?assertNotEqual(nomatch, binary:match(Workers2, <<"\"id\":\"w2\"">>)),
    {200, "application/json", <<"[]">>} = http_get("/api/workers/nobody-here"),
    {200, "application/json", Status} = http_get("/api/status"),
    ?assertNotEqual(nomatch, binary:match(Status, <<"\"worker_types\":">>)),
    {200, "application/json", <<"{", _/binary>>} = http_get("/api/metrics"),
    ok = couch_workers:worker_unregister(W2),
    ok = couch_workers:worker_unregister(W).

bad_requests_are_4xx() ->
    ?assertMatch({404, _, _}, http_get("/nope")),
    ?assertMatch({404, _, _}, http_get("/api/workers")),
    ?assertMatch({404, _, _}, http_get("/api/workers/a/b")),
    ?assertMatch({400, _, _}, http_get("/api/workers/" ++ lists:duplicate(10001, $x))),
    {ok, {{_, 405, _}, Headers, _}} = httpc:request(post, {url("/"), [], "text/plain", "x"}, [], []),
    ?assertEqual("GET", proplists:get_value("allow", Headers)),
    [
        ?assertMatch({ok, {{_, 405, _}, _, _}}, httpc:request(M, request(M, url("/api/status")), [], []))
     || M <- [delete, head, put]
    ],
    %% Still serving.
    ?assertMatch({200, _, _}, http_get("/api/worker_types")).

request(put, Url) -> {Url, [], "text/plain", "x"};
request(_, Url) -> {Url, []}.

%% Requests httpc would not send: each answered 4xx, and the listener
%% serves on. (A method HTTP does not define is 501 from httpd itself, as
%% RFC 9110 says; an unfinished request line waits for httpd's timeout.)
malformed_http_is_4xx() ->
    Long = binary:copy(<<"a">>, 20000),
    [
        ?assertMatch({Code, _} when Code >= 400 andalso Code < 500, {raw(Req), Req})
     || Req <- [
            <<"GET /api/workers/%ZZ HTTP/1.1\r\nHost: x\r\n\r\n">>,
            <<"GET /api/workers/%4 HTTP/1.1\r\nHost: x\r\n\r\n">>,
            <<"GET / HTTP/9.9\r\n\r\n">>,
            <<"GET / HTTP/1.1\r\nHost x\r\n\r\n">>,
            <<"PUT / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx">>,
            <<"GET /../../etc/passwd HTTP/1.1\r\nHost: x\r\n\r\n">>,
            <<"GET /", Long/binary, " HTTP/1.1\r\nHost: x\r\n\r\n">>
        ]
    ],
    ?assertMatch({200, _, _}, http_get("/")).

%% The status code of the answer to a raw request.
raw(Req) ->
    {ok, S} = gen_tcp:connect({127, 0, 0, 1}, couch_workers_http:port(), [binary, {active, false}], 5000),
    ok = gen_tcp:send(S, Req),
    {ok, <<"HTTP/1.", _, " ", Code:3/binary, _/binary>>} = gen_tcp:recv(S, 0, 5000),
    gen_tcp:close(S),
    binary_to_integer(Code).

killed_server_restarts() ->
    Old = whereis(couch_workers_http),
    [OldHttpd] = httpd_instances(),
    MRef = erlang:monitor(process, OldHttpd),
    ?assertEqual({error, {bad_call, nonsense}}, gen_server:call(Old, nonsense)),
    exit(Old, kill),
    %% Killed, it could not stop its httpd instance; the restarted server
    %% stops that one before it listens again (on a fixed port the
    %% leftover would hold the port), and serves.
    receive
        {'DOWN', MRef, process, OldHttpd, _} -> ok
    after 5000 -> erlang:error(httpd_instance_left_behind)
    end,
    couch_workers_test_util:wait_for(
        fun() ->
            New = whereis(couch_workers_http),
            is_pid(New) andalso New =/= Old andalso couch_workers_http:port() =/= undefined
        end,
        5000
    ),
    ?assertEqual(1, length(httpd_instances())),
    ?assertEqual(1, length([P || {httpd, P, _} <- inets:services_info()])),
    ?assertMatch({200, _, _}, http_get("/api/worker_types")).

no_listener() ->
    ?assertEqual(undefined, whereis(couch_workers_http)),
    ?assertEqual(undefined, couch_workers_http:port()).

bad_config_refused() ->
    Ctx = couch_workers_test_util:start_app(),
    couch_workers_test_util:stop_app(Ctx),
    ok = application:set_env(couch_workers, http, #{port => -1}),
    try
        ?assertMatch({error, _}, application:ensure_all_started(couch_workers)),
        ?assertEqual(undefined, whereis(couch_workers_sup))
    after
        application:unset_env(couch_workers, http)
    end.

parse_config() ->
    ?assertEqual({ok, #{port => 8080, ip => {127, 0, 0, 1}}}, couch_workers_http:parse_config(#{port => 8080})),
    ?assertEqual({ok, #{port => 0, ip => {0, 0, 0, 0}}}, couch_workers_http:parse_config(#{port => 0, ip => {0, 0, 0, 0}})),
    [
        ?assertEqual(error, couch_workers_http:parse_config(V))
     || V <- [8080, #{}, #{port => 70000}, #{port => "80"}, #{port => 80, ip => "127.0.0.1"}, #{port => 80, ip => {1, 2, 3}}, #{port => 80, extra => 1}]
    ].
