%% @doc A small JSON encoder for the status page's `/api/...' answers
%% (OTP 25 has no `json' module, and no JSON library is a dependency).
%%
%% Maps (atom, binary or integer keys), lists, binaries (strings),
%% integers, floats, `true', `false', `null'; other atoms become strings,
%% tuples lists. A binary that is not UTF-8 (ids and types are any bytes)
%% is encoded byte for byte as Latin-1 code points, so the answer is
%% always valid JSON.
-module(couch_workers_json).

-export([encode/1]).

-spec encode(term()) -> iodata().
encode(true) -> <<"true">>;
encode(false) -> <<"false">>;
encode(null) -> <<"null">>;
encode(undefined) -> <<"null">>;
encode(A) when is_atom(A) -> string(atom_to_binary(A));
encode(B) when is_binary(B) -> string(B);
encode(I) when is_integer(I) -> integer_to_binary(I);
encode(F) when is_float(F) -> float_to_binary(F, [short]);
encode(L) when is_list(L) -> [$[, lists:join($,, [encode(X) || X <- L]), $]];
encode(T) when is_tuple(T) -> encode(tuple_to_list(T));
encode(M) when is_map(M) ->
    Pairs = lists:sort([{key(K), V} || {K, V} <- maps:to_list(M)]),
    [${, lists:join($,, [[string(K), $:, encode(V)] || {K, V} <- Pairs]), $}];
encode(Other) ->
    string(iolist_to_binary(io_lib:format("~0p", [Other]))).

key(K) when is_binary(K) -> K;
key(K) when is_atom(K) -> atom_to_binary(K);
key(K) when is_integer(K) -> integer_to_binary(K);
key(K) -> iolist_to_binary(io_lib:format("~0p", [K])).

string(Bin) ->
    Chars =
        case unicode:characters_to_list(Bin) of
            L when is_list(L) -> L;
            _ -> binary_to_list(Bin)
        end,
    [$", [char(C) || C <- Chars], $"].

char($") -> <<"\\\"">>;
char($\\) -> <<"\\\\">>;
char($\n) -> <<"\\n">>;
char($\r) -> <<"\\r">>;
char($\t) -> <<"\\t">>;
char(C) when C < 16#20 -> io_lib:format("\\u~4.16.0b", [C]);
char(C) -> <<C/utf8>>.
