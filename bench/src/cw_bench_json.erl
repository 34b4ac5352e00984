%% @doc A small JSON encoder for the benchmark's result lines (OTP 25 has
%% no `json' module). Maps with atom or binary keys, lists, binaries,
%% integers, floats (at most 3 decimals; whole numbers from 1e6 up),
%% `true', `false', `null', other atoms as strings.
-module(cw_bench_json).

-export([encode/1]).

-spec encode(term()) -> binary().
encode(Term) ->
    iolist_to_binary(value(Term)).

value(true) -> <<"true">>;
value(false) -> <<"false">>;
value(null) -> <<"null">>;
value(undefined) -> <<"null">>;
value(A) when is_atom(A) -> string(atom_to_binary(A, utf8));
value(B) when is_binary(B) -> string(B);
value(I) when is_integer(I) -> integer_to_binary(I);
value(F) when is_float(F) -> float_str(F);
value(M) when is_map(M) -> object(M);
%% Lists are arrays (strings are binaries here, never charlists).
value(L) when is_list(L) -> [$[, lists:join($,, [value(V) || V <- L]), $]].

%% Keys in a stable order: `workload' first, then alphabetical.
object(M) ->
    Keys = lists:sort(fun key_order/2, maps:keys(M)),
    [${, lists:join($,, [[string(key(K)), $:, value(maps:get(K, M))] || K <- Keys]), $}].

key_order(workload, _) -> true;
key_order(_, workload) -> false;
key_order(A, B) -> key(A) =< key(B).

key(K) when is_atom(K) -> atom_to_binary(K, utf8);
key(K) when is_binary(K) -> K;
key(K) -> iolist_to_binary(io_lib:format("~0p", [K])).

float_str(F) when F >= 1.0e6; F =< -1.0e6 -> integer_to_binary(round(F));
float_str(F) ->
    %% At most 3 decimals, trailing zeros dropped (3.100 -> 3.1).
    S = float_to_binary(F, [{decimals, 3}, compact]),
    S.

string(B) ->
    [$", escape(B, <<>>), $"].

escape(<<>>, Acc) -> Acc;
escape(<<$", R/binary>>, Acc) -> escape(R, <<Acc/binary, "\\\"">>);
escape(<<$\\, R/binary>>, Acc) -> escape(R, <<Acc/binary, "\\\\">>);
escape(<<$\n, R/binary>>, Acc) -> escape(R, <<Acc/binary, "\\n">>);
escape(<<$\r, R/binary>>, Acc) -> escape(R, <<Acc/binary, "\\r">>);
escape(<<$\t, R/binary>>, Acc) -> escape(R, <<Acc/binary, "\\t">>);
escape(<<C, R/binary>>, Acc) when C < 16#20 ->
    Hex = list_to_binary(io_lib:format("\\u~4.16.0b", [C])),
    escape(R, <<Acc/binary, Hex/binary>>);
escape(<<C, R/binary>>, Acc) -> escape(R, <<Acc/binary, C>>).
